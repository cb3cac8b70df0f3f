"""`macspec cache`: what the prompt cache on disk holds, per model, the GGUF files converted
for MLX and the folders derived from Ollama MLX models; `cache clear` frees them."""

from __future__ import annotations

import json
import time
from typing import Annotated

import typer

from macspec.cli import options as opt
from macspec.cli.app import app, fail
from macspec.text import byte_size

cache_app = typer.Typer(
    help="The prompt cache on disk (its size per model), converted GGUF files and Ollama MLX "
    "models' folders; `cache clear` frees them.",
    invoke_without_command=True,
    no_args_is_help=False,
)
app.add_typer(cache_app, name="cache")


def _store(folder):
    from macspec.prefix.settings import DiskCacheSettings
    from macspec.prefix.store import DiskStore

    return DiskStore(DiskCacheSettings(folder=folder).root, max_bytes=0)


@cache_app.callback()
def cache(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    disk_cache_dir: opt.DiskCacheDir = None,
) -> None:
    """Show the prompt cache on disk (shared by run, chat and serve): its size per model, its
    blocks (the attention rows of 256 ids each), recurrent states and drafter inputs; and the
    GGUF files converted for MLX and the folders derived from Ollama MLX models (config and
    tokenizer; in the macspec home), with the file or manifest each came from."""
    if ctx.invoked_subcommand is not None:
        return
    from macspec.models.gguf.entries import derived_folders

    store = _store(disk_cache_dir)
    models = store.usage()
    derived = derived_folders()
    if as_json:
        record = {
            "folder": str(store.root),
            "total_bytes": sum(m.bytes for m in models),
            "models": [
                {
                    "name": m.name,
                    "folder": str(m.folder),
                    "bytes": m.bytes,
                    "files": m.files,
                    "last_used": m.last_used or None,
                }
                for m in models
            ],
            "gguf": _derived_json(derived, "gguf"),
            "ollama_mlx": _derived_json(derived, "ollama-mlx"),
        }
        typer.echo(json.dumps(record, indent=2))
        return
    holding = [m for m in models if m.files]  # a model whose prompts were all short: no row
    if not holding:
        typer.echo(f"the prompt cache is empty ({store.root})")
    else:
        _show_prompt_cache(store, holding)
    _show_derived(derived)


def _when(stamp: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(stamp)) if stamp else "-"


def _console():
    """stdout's console: on a terminal as wide as it is, names folded onto more lines; piped,
    wide enough that every name comes whole (for `cache clear --model NAME` to take)."""
    from rich.console import Console

    console = Console()
    return console if console.is_terminal else Console(width=240)


def _show_prompt_cache(store, models) -> None:
    from rich.table import Table

    table = Table(title=f"prompt cache: {store.root}", title_justify="left")
    table.add_column("model", overflow="fold")
    table.add_column("size", justify="right", no_wrap=True)
    table.add_column("blocks", justify="right", no_wrap=True)
    table.add_column("states", justify="right", no_wrap=True)
    table.add_column("drafter inputs", justify="right", no_wrap=True)
    table.add_column("last used", no_wrap=True)
    for m in models:
        files = m.files or {}
        hidden = sum(n for kind, n in files.items() if kind.startswith("hidden"))
        table.add_row(
            m.name, byte_size(m.bytes), str(files.get("rows", 0)), str(files.get("state", 0)),
            str(hidden), _when(m.last_used),
        )  # fmt: skip
    _console().print(table)
    typer.echo(f"total {byte_size(sum(m.bytes for m in models))}")


def _derived_json(derived, kind: str) -> dict:
    from macspec.models.gguf.entries import roots

    derived = [d for d in derived if d.kind == kind]
    return {
        "folder": str(roots()[kind]),
        "total_bytes": sum(d.bytes for d in derived),
        "files": [
            {
                "name": d.name,
                "store_names": list(d.store_names),
                "file": str(d.file) if d.file is not None else None,
                "file_exists": d.file_exists,
                "folder": str(d.folder),
                "converted_bytes": d.converted_bytes,
                "bytes": d.bytes,
                "last_used": d.last_used,
            }
            for d in derived
        ],
    }


def _show_derived(derived) -> None:
    """The derived folders, a table per kind: a file that is gone is said so (`cache clear
    --gguf` frees its folder)."""
    from macspec.models.gguf.entries import TITLES

    for kind, title in TITLES.items():
        _show_kind([d for d in derived if d.kind == kind], title, kind)


def _show_kind(derived, title: str, kind: str) -> None:
    if not derived:
        return
    from rich.table import Table

    from macspec.models.gguf.entries import roots

    table = Table(title=f"{title}: {roots()[kind]}", title_justify="left")
    table.add_column("file", overflow="fold", ratio=2)
    table.add_column("converted", justify="right", no_wrap=True)
    table.add_column("folder", justify="right", no_wrap=True)
    table.add_column("last used", no_wrap=True)
    table.add_column("in", overflow="fold", ratio=1)
    for d in derived:
        name = d.name if d.file_exists else f"{d.name} (file gone)"
        where = str(d.file.parent) if d.file is not None else str(d.folder)
        converted = byte_size(d.converted_bytes) if d.converted_bytes else "-"  # read as it is
        table.add_row(name, converted, byte_size(d.bytes), _when(d.last_used), where)
    _console().print(table)
    typer.echo(f"total {byte_size(sum(d.bytes for d in derived))}")


@cache_app.command("clear")
def clear(
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            "-m",
            help="Only this model's blocks and derived folder (as `macspec cache` names it).",
        ),
    ] = None,
    gguf: Annotated[
        bool,
        typer.Option(
            "--gguf",
            help="Only derived folders (converted GGUF files, Ollama MLX models'), not the "
            "prompt cache.",
        ),
    ] = False,
    disk_cache_dir: opt.DiskCacheDir = None,
) -> None:
    """Delete the prompt cache on disk, the converted GGUF files and Ollama MLX models' derived
    folders: everything, one model's, or (--gguf) only the derived folders. A removed folder is
    derived (and converted) again on its model's next load."""
    from macspec.models.gguf import entries

    store = _store(disk_cache_dir)
    if model is None:
        if not gguf:
            typer.echo(f"freed {byte_size(store.clear())} from {store.root}")
        for root in entries.roots().values():
            typer.echo(f"freed {byte_size(entries.remove_all(root))} from {root}")
        return
    models = [] if gguf else store.usage()
    chosen = [m for m in models if model in (m.name, m.folder.name)]
    derived = entries.named_folders(model)
    if not chosen and not derived:
        known = sorted({m.name for m in models} | {d.name for d in entries.derived_folders()})
        where = "among derived folders" if gguf else "in the prompt cache or derived folders"
        fail(f"no model named '{model}' {where} (cached: {', '.join(known) or 'none'})")
    if chosen:
        freed = sum(store.clear(m.folder) for m in chosen)
        typer.echo(f"freed {byte_size(freed)} from {store.root}")
    if derived:
        names = [d.name for d in derived]
        if len(set(names)) < len(names):  # one file's older conversions: their paths differ
            names = [str(d.file or d.folder) for d in derived]
        which = f" ({', '.join(names)})" if len(derived) > 1 else ""
        where = ", ".join(sorted({str(d.folder.parent) for d in derived}))
        typer.echo(f"freed {byte_size(entries.remove(derived))} from {where}{which}")
