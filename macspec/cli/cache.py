"""`macspec cache`: what the prompt cache on disk holds, per model; `cache clear` frees it."""

from __future__ import annotations

import json
import time
from typing import Annotated

import typer

from macspec.cli import options as opt
from macspec.cli.app import app, fail

cache_app = typer.Typer(
    help="The prompt cache on disk: its size per model; `cache clear` frees it.",
    invoke_without_command=True,
    no_args_is_help=False,
)
app.add_typer(cache_app, name="cache")


def _store(folder):
    from macspec.prefix.settings import DiskCacheSettings
    from macspec.prefix.store import DiskStore

    return DiskStore(DiskCacheSettings(folder=folder).root, max_bytes=0)


def _size(nbytes: int) -> str:
    return f"{nbytes / 1e9:.2f} GB" if nbytes >= 1e8 else f"{nbytes / 1e6:.1f} MB"


@cache_app.callback()
def cache(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    disk_cache_dir: opt.DiskCacheDir = None,
) -> None:
    """Show the prompt cache on disk (shared by run, chat and serve): its size per model, its
    blocks (the attention rows of 256 ids each), recurrent states and drafter inputs."""
    if ctx.invoked_subcommand is not None:
        return
    store = _store(disk_cache_dir)
    models = store.usage()
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
        }
        typer.echo(json.dumps(record, indent=2))
        return
    if not models:
        typer.echo(f"the prompt cache is empty ({store.root})")
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"prompt cache: {store.root}", title_justify="left")
    table.add_column("model", max_width=40)
    table.add_column("size", justify="right", no_wrap=True)
    table.add_column("blocks", justify="right", no_wrap=True)
    table.add_column("states", justify="right", no_wrap=True)
    table.add_column("drafter inputs", justify="right", no_wrap=True)
    table.add_column("last used", no_wrap=True)
    for m in models:
        files = m.files or {}
        hidden = sum(n for kind, n in files.items() if kind.startswith("hidden"))
        used = time.strftime("%Y-%m-%d %H:%M", time.localtime(m.last_used)) if m.last_used else "-"
        table.add_row(
            m.name, _size(m.bytes), str(files.get("rows", 0)), str(files.get("state", 0)),
            str(hidden), used,
        )  # fmt: skip
    Console().print(table)
    typer.echo(f"total {_size(sum(m.bytes for m in models))}")


@cache_app.command("clear")
def clear(
    model: Annotated[
        str | None,
        typer.Option(
            "--model", "-m", help="Only this model's blocks (its name as `macspec cache` shows)."
        ),
    ] = None,
    disk_cache_dir: opt.DiskCacheDir = None,
) -> None:
    """Delete the prompt cache on disk: everything, or one model's blocks."""
    store = _store(disk_cache_dir)
    models = store.usage()
    if model is not None:
        chosen = [m for m in models if model in (m.name, m.folder.name)]
        if not chosen:
            known = ", ".join(sorted({m.name for m in models})) or "none"
            fail(f"no model named '{model}' in the prompt cache (cached: {known})")
        freed = sum(store.clear(m.folder) for m in chosen)
    else:
        freed = store.clear()
    typer.echo(f"freed {_size(freed)} from {store.root}")
