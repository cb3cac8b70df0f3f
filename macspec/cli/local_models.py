"""`macspec models`' "on this Mac" part: the models already in Ollama's store, LM Studio's and
the Hugging Face cache, as a table or JSON."""

from __future__ import annotations

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


def local_json(model: LocalModel, models: list[LocalModel]) -> dict[str, Any]:
    """One entry of `macspec models --local --json`; `drafts`: the models here that can draft
    for it, the one `--draft-model auto` takes first; `carried_drafts`: drafters inside it (an
    Ollama MLX manifest's DFlash draft: `--draft auto` takes it)."""
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
    }


def local_table(models: list[LocalModel]) -> Table:
    """The models on this machine, one row each; an unreadable or unsupported one says so in
    its last column (why: below)."""
    table = Table(title="on this Mac", title_justify="left", caption_justify="left")
    for header in ("model", "store", "size", "quant", "arch", "context", "memory", "fits"):
        right = header in {"size", "context", "memory"}
        table.add_column(header, justify="right" if right else "left", no_wrap=True)
    for model in models:
        about = model.about
        if about is None:
            table.add_row(model.name, STORE_LABELS[model.store], *["-"] * 5, "unreadable")
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
        )
    table.caption = "memory: weights + KV cache at the model's full context (+: KV cache unknown)."
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
    console.print(local_table(models))
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
