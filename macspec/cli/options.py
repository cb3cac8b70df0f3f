"""Options shared by run, chat and bench, named as mlx-lm names them."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from macspec.errors import MacspecError

if TYPE_CHECKING:
    from macspec.engine.core.config import CacheOptions, GenerationConfig
    from macspec.engine.core.grammar import Grammar
    from macspec.models.catalog import ResolvedModels
    from macspec.prefix.settings import DiskCacheSettings

Model = Annotated[
    str | None,
    typer.Option(
        "--model",
        "-m",
        help="Target model: a local mlx-lm folder, a .gguf file, a downloaded repo id, "
        "ollama:NAME[:TAG] (or NAME:TAG) or lmstudio:PUBLISHER/REPO[/FILE.gguf].",
    ),
]
DraftModel = Annotated[
    str | None,
    typer.Option(
        "--draft-model",
        help="Draft model (shares the target's tokenizer), in the same forms as --model; "
        "'auto': the best one on this Mac (see `macspec models --local`).",
    ),
]


def _checked_layout_name(value: str | None) -> str | None:
    """The flag's value, checked as it is parsed: a bad name is one line before any model is
    resolved (deriving a GGUF's folder reads its whole vocabulary)."""
    if value is not None:
        from macspec.models.gguf.layout import parse_layout

        parse_layout(value)
    return value


GgufLayout = Annotated[
    str | None,
    typer.Option(
        "--gguf-layout",
        envvar="MACSPEC_GGUF_LAYOUT",  # layout.LAYOUT_ENV (mlx: not imported at start-up)
        help="How a GGUF file is held in memory: 'compact' (the default: near the file's own "
        "bytes, float16 scales) or 'exact' (float32 scales, gguf's values bit for bit, about "
        "1.7x the file). A pair's gguf_layout in models.toml sets it too.",
        callback=_checked_layout_name,
    ),
]


def gguf_layout(flag: str | None, resolved: ResolvedModels | None) -> None:
    """The layout the GGUF loads to come take: the flag, else the catalog pair's, else compact;
    a bad name is one line (resolving names loads no weights: still before any is read)."""
    from macspec.models.gguf.layout import set_default_layout

    pair = resolved.pair if resolved is not None else None
    pair_layout = pair.gguf_layout if pair is not None else None
    set_default_layout(flag or pair_layout or "compact")


PairName = Annotated[
    str | None,
    typer.Option(
        "--pair",
        "-p",
        help="A pair from the catalog, or TARGET+DRAFT (two model names; see `macspec models`).",
    ),
]
Temp = Annotated[float, typer.Option("--temp", help="Sampling temperature; 0 is greedy.")]
TopP = Annotated[float, typer.Option("--top-p", help="Nucleus sampling mass (1 = off).")]
TopK = Annotated[int, typer.Option("--top-k", help="Sample among the k likeliest (0 = off).")]
MinP = Annotated[float, typer.Option("--min-p", help="Drop tokens below min-p x the top one.")]
DEFAULT_MAX_TOKENS = 512
"""Tokens per answer when the user does not say: one figure for run, chat and serve (an answer
still ends at the model's context window, 'context'). bench alone differs: it times many short
answers (its help says so)."""
MaxTokens = Annotated[int, typer.Option("--max-tokens", help="Most tokens to generate.")]
MAX_SEED = 2**64 - 1
"""Seeds are unsigned 64-bit integers (MLX's random keys)."""
Seed = Annotated[
    int | None,
    typer.Option(
        "--seed",
        min=-1,
        max=MAX_SEED,
        help="Seed for reproducible sampling; -1 (as the APIs take it) is a fresh one each time.",
    ),
]
NumDraftTokens = Annotated[
    str | None,
    typer.Option(
        "--num-draft-tokens",
        "-k",
        metavar="N|auto",
        help="Tokens to guess per cycle: a number, or 'auto' (adaptive; the default).",
    ),
]
DraftTree = Annotated[
    str | None,
    typer.Option(
        "--draft-tree",
        metavar="N|auto|off",
        help="Verify a tree of guesses per target pass, several candidates per position: N is "
        "the most nodes per pass, 'auto' prices tree sizes on this device from measured pass "
        "costs and acceptance by candidate rank, 'off' verifies chains [default: off].",
    ),
]
NoDraft = Annotated[
    bool, typer.Option("--no-draft", help="Plain decoding with the target alone (for comparison).")
]
DraftSource = Annotated[
    str | None,
    typer.Option(
        "--draft",
        help="Where guesses come from: 'model' (the draft model), 'lookup' (n-grams of the "
        "context, no draft model needed), 'suffix' (the longest match in everything said to "
        "this model before, this request included), 'hybrid' (lookup or the draft model), "
        "'mtp' (the target's MTP head), 'dflash' (a DFlash block drafter), 'eagle3' (an "
        "EAGLE-3 head) or 'auto' (each cycle, the drafter that promises the most tokens per "
        "second) [default: the draft folder's kind, else lookup; serve's is auto, since an "
        "agent's requests repeat what came before].",
    ),
]
ServeDraftSource = Annotated[
    str | None,
    typer.Option(
        "--draft",
        help="Where guesses come from: 'model', 'lookup', 'suffix', 'hybrid', 'mtp', 'dflash', "
        "'eagle3' (as for run) or 'auto' (each cycle, the drafter that promises the most tokens "
        "per second: lookup over the whole conversation and suffix over every earlier request, "
        "beside the pair's drafters) [default: auto; run and chat take the draft folder's kind, "
        "one answer having no earlier requests to match].",
    ),
]
Stop = Annotated[
    list[str] | None,
    typer.Option("--stop", help="Stop when this text appears (repeatable); it is not printed."),
]
Think = Annotated[
    bool | None,
    typer.Option(
        "--think/--no-think",
        help="Let a thinking model (Qwen3, Qwen3.5) reason before answering, or not "
        "[default: the chat template's own].",
    ),
]
System = Annotated[str | None, typer.Option("--system", help="A system prompt.")]
ChatTemplateArgs = Annotated[
    str | None,
    typer.Option(
        "--chat-template-args",
        help="Extra chat template arguments as a JSON object, e.g. '{\"enable_thinking\": false}'.",
    ),
]
JsonSchema = Annotated[
    Path | None,
    typer.Option(
        "--json-schema",
        help="Constrain the answer to this JSON schema (a .json file): it is compact JSON "
        "that fits it, unless cut before it was complete (by --max-tokens, say): then run says "
        "so and exits 3.",
    ),
]
Regex = Annotated[
    str | None,
    typer.Option(
        "--regex",
        help="Constrain the answer to match this regular expression (whole); one of "
        "--json-schema, --regex, --grammar.",
    ),
]
GrammarFile = Annotated[
    Path | None,
    typer.Option(
        "--grammar",
        help="Constrain the answer to this Lark grammar (a .lark file, llguidance's Lark).",
    ),
]


def grammar_option(
    json_schema: Path | None, regex: str | None, grammar: Path | None
) -> Grammar | None:
    """The grammar of --json-schema, --regex or --grammar (None: none given), checked before
    any model loads: an unreadable file, a file that is not a schema or a grammar llguidance
    cannot compile is one line naming the flag."""
    from macspec.engine.core.grammar import Grammar

    given = [(flag, v) for flag, v in (("--json-schema", json_schema), ("--regex", regex),
                                        ("--grammar", grammar)) if v is not None]  # fmt: skip
    if not given:
        return None
    if len(given) > 1:
        raise MacspecError(f"{given[0][0]} and {given[1][0]} both given; pass one of them")
    flag, value = given[0]
    if isinstance(value, Path):
        try:
            source = value.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            raise MacspecError(f"{flag} {value}: cannot read it ({reason})") from None
    else:
        source = value
    kind = {"--json-schema": "json_schema", "--regex": "regex", "--grammar": "lark"}[flag]
    try:
        found = Grammar(kind, source)
        problem = _compile_problem(found)
    except MacspecError as exc:
        raise MacspecError(f"{flag} {value}: {exc}") from None
    if problem:
        raise MacspecError(f"{flag} {value}: the {kind} cannot be used: {problem}")
    return found


def _compile_problem(grammar: Grammar) -> str:
    """llguidance's first line about a grammar it cannot compile ('' when it can)."""
    from llguidance import LLMatcher

    try:
        text = LLMatcher.validate_grammar(grammar.compiled())
    except (ValueError, TypeError, RuntimeError) as exc:
        text = str(exc) or type(exc).__name__
    lines = [line.strip() for line in (text or "").strip().splitlines() if line.strip()]
    if not lines:
        return ""
    said = [line for line in lines[1:] if line.startswith("error:")]  # a regex parser's why
    return f"{lines[0]} {said[0]}" if lines[0].endswith(":") and said else lines[0]


def with_grammar(
    config: GenerationConfig, json_schema: Path | None, regex: str | None, grammar: Path | None
) -> GenerationConfig:
    """`config` constrained by the structured-output flag given, if any."""
    from dataclasses import replace

    found = grammar_option(json_schema, regex, grammar)
    return config if found is None else replace(config, grammar=found)


def stop_strings(stop: list[str] | None) -> tuple[str, ...]:
    """`--stop` values; an empty one (it would match everywhere, or be ignored) is an error."""
    if any(text == "" for text in stop or ()):
        raise MacspecError("--stop needs some text to stop at; an empty --stop is not allowed")
    return tuple(stop or ())


def check_fits(tokens: int, context: int | None, model: str, what: str = "the prompt") -> None:
    """A prompt must leave room in the model's context window for at least one token."""
    if context is not None and tokens >= context:
        raise MacspecError(
            f"{what} is {tokens} tokens and the context of {model} holds {context}; shorten it"
        )


Sampler = Annotated[
    str | None,
    typer.Option(
        "--sampler",
        help="Sampled runs: 'coupled' (the output is exactly plain decoding's with the same "
        "--seed, whatever drafts) or 'rejection' (keeps the most guesses) [default: coupled "
        "with a --seed, else rejection].",
    ),
]
KvBits = Annotated[
    int | None,
    typer.Option("--kv-bits", help="Quantize the KV cache to 4 or 8 bits (default: off)."),
]
KvGroupSize = Annotated[
    int, typer.Option("--kv-group-size", help="Group size of the KV cache quantization.")
]
QuantizedKvStart = Annotated[
    int,
    typer.Option(
        "--quantized-kv-start", help="Quantize a layer's KV cache once it holds this many ids."
    ),
]
MaxKvSize = Annotated[
    int | None,
    typer.Option(
        "--max-kv-size", help="Keep at most this many ids in the KV cache (a sliding window)."
    ),
]
DiskCacheGb = Annotated[
    float,
    typer.Option(
        "--disk-cache-gb",
        help="Most gigabytes of prompt cache on disk, shared by run, chat and serve across "
        "restarts (fractions allowed; 0: off, nothing written).",
    ),
]
DiskCacheDir = Annotated[
    Path | None,
    typer.Option(
        "--disk-cache-dir",
        metavar="DIR",
        help="Where the prompt cache on disk lives [default: prompt-cache in the macspec home].",
    ),
]
PrefillStepSize = Annotated[
    int, typer.Option("--prefill-step-size", help="Prompt ids per prefill pass.")
]


def generation_config(
    max_tokens: int,
    temp: float,
    top_p: float,
    top_k: int,
    min_p: float,
    stop: list[str] | None,
    seed: int | None,
    sampler: str | None,
    prefill_step_size: int,
) -> GenerationConfig:
    """run's and chat's GenerationConfig from their flags, every value checked before any model
    loads (a bad --sampler name too, even when greedy). Loads no mlx-lm."""
    from macspec.engine.core.config import GenerationConfig
    from macspec.engine.core.sampling import SamplingParams, choose_sampler

    seed = seed if seed is None or seed >= 0 else None  # -1: unseeded, as the APIs take it
    config = GenerationConfig(
        max_tokens=max_tokens,
        sampling=SamplingParams(temperature=temp, top_p=top_p, top_k=top_k, min_p=min_p),
        stop_strings=stop_strings(stop),
        seed=seed,
        sampler=sampler,
        prefill_step_size=prefill_step_size,
    )
    if temp > 0:
        choose_sampler(sampler, seed)
    elif sampler is not None:  # greedy uses no sampler, but a misspelt one is still an error
        choose_sampler(sampler, seed=0)
    return config


def cache_options(
    kv_bits: int | None, kv_group_size: int, quantized_kv_start: int, max_kv_size: int | None
) -> CacheOptions:
    """The engine's CacheOptions from the flags (validated there, before any model loads)."""
    from macspec.engine.core.config import CacheOptions

    return CacheOptions(kv_bits, kv_group_size, quantized_kv_start, max_kv_size)


def disk_cache(gb: float, folder: Path | None) -> DiskCacheSettings:
    """The prompt cache's settings from --disk-cache-gb and --disk-cache-dir."""
    from macspec.models.home import check_folder_path
    from macspec.prefix.settings import DiskCacheSettings

    if gb < 0:
        raise MacspecError(f"--disk-cache-gb must be >= 0 (0 turns it off), got {gb}")
    settings = DiskCacheSettings(gb=gb, folder=folder)
    if settings.enabled:  # said before the model loads, not when the first block is written
        check_folder_path(
            settings.root, "the prompt cache folder", "give --disk-cache-dir another folder"
        )
    return settings
