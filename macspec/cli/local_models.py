"""`macspec models`' "on this Mac" part: the models already in Ollama's store, LM Studio's and
the Hugging Face cache, as a table or JSON."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from macspec.models.stores.listing import LocalModel, store_places
from macspec.models.stores.pairing import drafts_for, local_pairs

STORE_LABELS = {"ollama": "Ollama", "lmstudio": "LM Studio", "hf": "HF cache"}


def _gb(n: int | None) -> str:
    if n is None:
        return "-"
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{max(n / 1e6, 0.1):.1f} MB"


def converted_copies() -> dict[Path, int]:
    """The bytes of the converted copies macspec keeps on disk, by the GGUF file they came from
    (every layout and every version of the file counted: all of it is disk a file costs)."""
    from macspec.models.gguf.entries import GGUF, derived_folders  # mlx: not at start-up

    kept: dict[Path, int] = {}
    for derived in derived_folders():
        if derived.kind == GGUF and derived.file is not None and derived.converted_bytes:
            source = derived.file.resolve()
            kept[source] = kept.get(source, 0) + derived.converted_bytes
    return kept


def _converted(model: LocalModel, kept: dict[Path, int]) -> int:
    return kept.get(model.path.resolve(), 0) if model.path is not None else 0


def local_json(
    model: LocalModel, models: list[LocalModel], kept: dict[Path, int]
) -> dict[str, Any]:
    """One entry of `macspec models --local --json`; `drafts`: the models here that can draft
    for it, the one `--draft-model auto` takes first; `carried_drafts`: drafters inside it (an
    Ollama MLX manifest's DFlash draft: `--draft auto` takes it); `converted_bytes`: the
    converted copy on disk (`kept`: `converted_copies()`), 0 when none is kept."""
    about = model.about
    memory = about.memory if about is not None else None
    return {
        "name": model.name,
        "store": model.store,
        "path": str(model.path) if model.path is not None else None,
        "readable": about is not None,
        "runnable": model.runnable,
        "error": model.error,
        "format": about.format if about else None,
        "size_bytes": about.size_bytes if about else None,
        "quantization": about.quantization if about else None,
        "architecture": about.architecture if about else None,
        "context_length": about.context_length if about else None,
        "memory_bytes": memory.total_bytes if memory else None,
        "kv_cache_bytes": memory.kv_cache_bytes if memory else None,
        "available_memory_bytes": memory.available_bytes if memory else None,
        "fits": memory.fits if memory else None,
        "tokenizer": about.tokenizer if about else None,
        "drafts": [draft.name for draft in drafts_for(model, models)],
        "carried_drafts": list(about.carried_drafts) if about else [],
        "converted_bytes": _converted(model, kept),
    }


def local_table(models: list[LocalModel], kept: dict[Path, int]) -> Table:
    """The models on this machine, one row each; an unreadable or unsupported one says so in
    its fits column (why: below); `kept`: the converted copies on disk (`converted_copies()`)."""
    table = Table(title="on this Mac", title_justify="left", caption_justify="left")
    columns = ("model", "store", "size", "quant", "arch", "context", "memory", "fits", "converted")
    for header in columns:
        right = header in {"size", "context", "memory", "converted"}
        table.add_column(header, justify="right" if right else "left", no_wrap=True)
    for model in models:
        about = model.about
        if about is None:
            table.add_row(model.name, STORE_LABELS[model.store], *["-"] * 5, "unreadable", "-")
            continue
        memory = about.memory
        fits = "?" if memory is None else {True: "yes", False: "no", None: "?"}[memory.fits]
        fits = fits if model.runnable else "unsupported"
        kv_known = memory is not None and memory.kv_cache_bytes is not None
        table.add_row(
            model.name,
            STORE_LABELS[model.store],
            _gb(about.size_bytes),
            about.quantization or about.format,
            " +".join((about.architecture or "-", *about.carried_drafts)),
            str(about.context_length) if about.context_length else "-",
            _gb(memory.total_bytes) + ("" if kv_known else "+") if memory else "-",
            fits,
            _gb(_converted(model, kept) or None),
        )
    table.caption = (
        "memory: weights + KV cache at the model's full context (+: KV cache unknown); "
        "converted: the copy of a GGUF file macspec keeps on disk (its first run makes it; "
        "`macspec cache clear --model NAME` frees it)."
    )
    return table


def print_local(models: list[LocalModel], console: Console) -> None:
    """The table (as wide as it needs when not on a terminal: names are never cut), then
    why each unreadable or unsupported entry is, then where the stores were looked for."""
    if not console.is_terminal:
        console = Console(width=1000, highlight=False)
    places = "; ".join(f"{STORE_LABELS[k]}: {v}" for k, v in store_places().items())
    if not models:
        console.print(f"on this Mac: no models found ({places})", highlight=False)
        return
    console.print(local_table(models, converted_copies()))
    for model in models:
        if model.error is not None:
            why = model.error.removeprefix(f"{model.name}: ")
            label = "unreadable" if model.about is None else "unsupported"
            console.print(f"{label} {model.name}: {why}", highlight=False)
    console.print(f"Looked in {places}.", highlight=False, soft_wrap=True)
    pairs = local_pairs(models)
    if pairs:
        console.print("Pairs on this Mac (same tokenizer, the draft at most half the size):")
        for pair in pairs:
            console.print(f"  --pair {pair.spec}", highlight=False)
