"""`macspec serve` without `--model`: every runnable model on this Mac, each loaded when a request
first names it (with the draft `--draft-model auto` pairs it with, and its Ollama params as
defaults), unloaded by keep_alive and the memory budget."""

from __future__ import annotations

import sys
from collections.abc import Callable

import typer

from macspec.cli.app import fail
from macspec.errors import MacspecError

GB = 1e9


def resolve_servable(servable, need_draft: bool):
    """The models to load for a pool entry: a catalog pair as `--pair` takes it; a model with
    the draft `--draft-model auto` finds (none found: the model alone, drafting by lookup)."""
    from macspec.models.catalog import AUTO_DRAFT, resolve_models

    if servable.is_pair:
        return resolve_models(servable.name, None, None, need_draft=need_draft)
    if need_draft:
        try:
            return resolve_models(None, servable.name, AUTO_DRAFT)
        except MacspecError as exc:
            if "--draft-model auto: no model" not in str(exc):
                raise
    return resolve_models(None, servable.name, None, need_draft=False)


def make_loader(draft_args: tuple, defaults_for: Callable, listen: tuple, disk=None):
    """Servable -> a Backend, built as `macspec serve --model NAME` builds its one;
    `defaults_for(resolved)`: the request defaults for those models (the flags, and the
    model's Ollama params where no flag was given)."""
    from macspec.cli.gguf_notes import gguf_loading
    from macspec.cli.serve_backend import backend_for, open_batched
    from macspec.models.flags import needs_draft_model
    from macspec.prefix.tier import attach_pair

    num_draft_tokens, no_draft, draft, _ = draft_args
    max_batch = listen[6]

    def load(servable):
        print(f"macspec: loading {servable.model_id}…", file=sys.stderr, flush=True)
        resolved = resolve_servable(servable, needs_draft_model(draft, no_draft))
        if resolved.draft_choice is not None:
            print(f"macspec: {resolved.draft_choice}", file=sys.stderr, flush=True)
        with gguf_loading():
            loaded = open_batched(resolved, draft_args, {}, max_batch)
        if disk is not None:
            attach_pair(loaded.engine, resolved, disk)
        own = defaults_for(resolved)
        return backend_for(
            resolved, loaded, num_draft_tokens, own, listen, model_id=servable.model_id
        )

    return load


def serve_pool(
    ctx: typer.Context, draft_args: tuple, defaults, listen: tuple, disk, limits: tuple
) -> None:
    """Serve every runnable model until stopped."""
    from macspec.cli.store_params import serve_defaults
    from macspec.models.memory import usable_memory_bytes
    from macspec.serve.pool import ModelPool, keep_alive_seconds
    from macspec.serve.servable import servable_models
    from macspec.serve.server import bind, run_server

    keep_alive, max_loaded, budget_gb = limits
    try:
        keep_alive_s = keep_alive_seconds(keep_alive, "--keep-alive")
    except Exception as exc:  # an APIError: the same words, as a flag's
        fail(str(exc))
    if max_loaded is not None and max_loaded < 1:
        fail(f"--max-loaded-models must be >= 1, got {max_loaded}")
    if budget_gb is not None and budget_gb <= 0:
        fail(f"--memory-budget must be > 0 GB, got {budget_gb}")
    budget = int(budget_gb * GB) if budget_gb is not None else usable_memory_bytes()
    host, port, api_key = listen[:3]
    sock = bind(host, port)
    models = servable_models()
    # Each model's Ollama params, where no flag was given.
    load = make_loader(draft_args, lambda r: serve_defaults(defaults, r, ctx), listen, disk)
    pool = ModelPool(models, load, keep_alive_s, max_loaded, budget)
    names = ", ".join(m.model_id for m in models)
    room = f"{budget / GB:.1f} GB" if budget is not None else "unknown memory"
    cap = f", at most {max_loaded} at once" if max_loaded else ""

    def announce(url: str) -> None:
        print(
            f"macspec: serving {len(models)} models, each loaded on first request ({room} for "
            f"models{cap}): {names}\nmacspec: at {url}; Ctrl-C stops",
            file=sys.stderr,
            flush=True,
        )

    run_server(pool, sock, host, api_key, announce)
    print("macspec: server stopped", file=sys.stderr)
