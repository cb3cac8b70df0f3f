"""An Ollama model's `params` layer as defaults: each value applies unless its flag was given on
the command line (the command's typer context says where each parameter's value came from)."""

from __future__ import annotations

import sys
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import typer

from macspec.errors import MacspecError

if TYPE_CHECKING:
    from macspec.engine.core.config import GenerationConfig
    from macspec.models.catalog import ResolvedModels

FLAG_OF = {
    "temperature": "temp",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "seed": "seed",
    "stop": "stop",
    "num_predict": "max_tokens",
}
"""Ollama's option name -> the command's parameter it stands in for (others are not used)."""


def _flag_given(context: typer.Context, parameter: str) -> bool:
    source = context.get_parameter_source(parameter)
    return source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP")


def _checked(key: str, value: Any, name: str) -> Any:
    """A params value of the type its flag takes, else one line naming the model."""
    if key == "stop":
        stops = [value] if isinstance(value, str) else value
        if isinstance(stops, list) and all(isinstance(s, str) and s for s in stops):
            return tuple(stops)
        raise MacspecError(f"{name}: its Ollama params give stop = {value!r}, not texts")
    wanted = int if key in ("top_k", "seed", "num_predict") else (int, float)
    if isinstance(value, bool) or not isinstance(value, wanted):
        raise MacspecError(f"{name}: its Ollama params give {key} = {value!r}, not a number")
    return value


def store_defaults(resolved: ResolvedModels, context: typer.Context) -> dict[str, Any]:
    """The target's Ollama params that no flag overrides, by parameter name (`temp`, ...).
    Ollama's `num_predict` of -1 (or less) means no limit, so it is left to the flag."""
    chosen: dict[str, Any] = {}
    for key, value in resolved.store_params.items():
        parameter = FLAG_OF.get(key)
        if parameter is None or _flag_given(context, parameter):
            continue
        value = _checked(key, value, resolved.target_name)
        if key == "num_predict" and value < 1:
            continue
        chosen[parameter] = value
    return chosen


def with_store_params(
    config: GenerationConfig, resolved: ResolvedModels, context: typer.Context
) -> GenerationConfig:
    """run's and chat's config with the target's Ollama params where no flag was given."""
    from macspec.engine.core.sampling import SamplingParams

    chosen = store_defaults(resolved, context)
    if not chosen:
        return config
    sampling = config.sampling
    try:
        sampling = SamplingParams(
            temperature=float(chosen.get("temp", sampling.temperature)),
            top_p=float(chosen.get("top_p", sampling.top_p)),
            top_k=chosen.get("top_k", sampling.top_k),
            min_p=float(chosen.get("min_p", sampling.min_p)),
        )
    except MacspecError as exc:  # a value out of range: the manifest's, not a flag's
        raise MacspecError(f"{resolved.target_name}: its Ollama params: {exc}") from None
    return replace(
        config,
        sampling=sampling,
        stop_strings=chosen.get("stop", config.stop_strings),
        seed=chosen.get("seed", config.seed),
        max_tokens=chosen.get("max_tokens", config.max_tokens),
    )


def serve_defaults(defaults: Any, resolved: ResolvedModels, context: typer.Context) -> Any:
    """serve's request defaults (`serve.backend.Defaults`) with the target's Ollama params
    (sampling, length, stop strings, seed) where no flag was given; a request's own values
    still win."""
    chosen = store_defaults(resolved, context)
    fields = {"temp": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p"}
    fields.update(max_tokens="max_tokens", stop="stop", seed="seed")
    return replace(defaults, **{fields[k]: v for k, v in chosen.items() if k in fields})


def say_draft_choice(resolved: ResolvedModels) -> None:
    """`--draft-model auto`: which draft was picked, one line on stderr."""
    if resolved.draft_choice is not None:
        print(f"macspec: {resolved.draft_choice}", file=sys.stderr, flush=True)
