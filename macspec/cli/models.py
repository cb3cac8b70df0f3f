"""`macspec models`, `macspec pull`, `macspec rm`: the catalog of pairs and the model cache."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table

from macspec.cli.app import app, fail
from macspec.models import hub
from macspec.models.catalog import Catalog, Pair, PairStatus, load_catalog, pair_status
from macspec.models.memory import (
    MemoryEstimate,
    estimate,
    machine_memory_bytes,
    usable_memory_bytes,
)

NameArg = Annotated[
    str,
    typer.Argument(
        help="A pair name from `macspec models`, or one Hugging Face repo id (org/name).",
        metavar="PAIR|REPO",
        show_default=False,
    ),
]


def _gb(n: int | None) -> str:
    """Bytes for people: GB with one decimal, MB below 1 GB (the demo pair is a few MB)."""
    if n is None:
        return "-"
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{max(n / 1e6, 0.1):.1f} MB"


def _stderr() -> Console:
    return Console(stderr=True)


# ---- macspec models -------------------------------------------------------------------------


def _status_json(status: PairStatus) -> dict:
    pair, memory = status.pair, status.memory
    on_disk = [s for s in (status.target_size_bytes, status.draft_size_bytes) if s is not None]
    return {
        "name": pair.name,
        "description": pair.description,
        "target": pair.target,
        "draft": pair.draft,
        "more_drafts": list(pair.more_drafts),
        "heads": pair.heads,
        "unsupported": list(pair.unsupported),
        "draft_policy": pair.draft_policy,
        "context_length": pair.context_length,
        "downloaded": status.downloaded,
        "target_path": str(status.target_path) if status.target_path else None,
        "draft_path": str(status.draft_path) if status.draft_path else None,
        "target_size_bytes": status.target_size_bytes,
        "draft_size_bytes": status.draft_size_bytes,
        "size_on_disk_bytes": sum(on_disk),
        "download_size_bytes": int(pair.size_gb * 1e9),
        "weights_bytes": memory.weights_bytes,
        "kv_cache_bytes": memory.kv_cache_bytes,
        "memory_bytes": memory.total_bytes,
        "ranks": pair.ranks,
        "memory_per_rank_bytes": memory.per_rank_bytes,
        "available_memory_bytes": memory.available_bytes,
        "fits": memory.fits,
        "estimated": memory.estimated,
    }


def _status_rows(statuses: list[PairStatus]) -> list[list[str]]:
    rows = []
    for status in statuses:
        pair, memory = status.pair, status.memory
        missing = len(status.missing)
        downloaded = "yes" if not missing else "partly" if missing < len(pair.members) else "no"
        on_disk = [s for s in (status.target_size_bytes, status.draft_size_bytes) if s is not None]
        mark = "~" if memory.estimated else ""
        mem = mark + _gb(memory.per_rank_bytes) + ("" if memory.kv_cache_bytes is not None else "+")
        if pair.ranks > 1:  # per machine, on each of `ranks`
            mem = f"{pair.ranks}×{mem}"
        fits = {True: "yes", False: "no", None: "?"}[memory.fits]
        fits += mark if memory.fits is not None else ""
        rows.append(
            [
                pair.name,
                downloaded,
                _gb(sum(on_disk)) if on_disk else "-",
                "package" if pair.is_packaged else f"~{pair.size_gb:.1f} GB",
                mem,
                fits,
                pair.description,
            ]
        )
    return rows


def _status_table(statuses: list[PairStatus], width: int) -> Table:
    """The table, its fixed columns at full width and the description cut to what is left."""
    headers = ["pair", "downloaded", "on disk", "download", "memory", "fits", "description"]
    rows = _status_rows(statuses)
    widths = [max(len(row[i]) for row in [headers, *rows]) for i in range(len(headers) - 1)]
    room = width - sum(widths) - 3 * len(headers) - 1  # borders and padding
    with_description = room >= 12
    table = Table(title="macspec model pairs", title_justify="left", caption_justify="left")
    for header, column_width in zip(headers, widths):
        table.add_column(
            header,
            justify="right" if header in {"on disk", "download", "memory"} else "left",
            no_wrap=True,
            min_width=column_width,
        )
    if with_description:
        table.add_column("description", no_wrap=True, max_width=room)
    for row in rows:
        description = row[-1] if len(row[-1]) <= room else row[-1][: room - 1] + "…"
        table.add_row(*row[:-1], *([description] if with_description else []))
    total, usable = machine_memory_bytes(), usable_memory_bytes()
    sharded = ""
    if any(s.pair.ranks > 1 for s in statuses):
        sharded = (
            "N×: on each of N machines (mlx.launch), the target's weights and KV cache over N "
            "plus the draft whole; fits: this machine as one of them. "
        )
    table.caption = (
        f"memory: weights + KV cache at the full context; ~: estimated from the "
        f"catalog's published sizes until pulled; +/?: KV cache unknown. {sharded}"
        f"This machine: {_gb(total)}, {_gb(usable)} for models."
    )
    return table


@app.command("models")
def models(
    as_json: Annotated[
        bool, typer.Option("--json", help="Print a JSON list instead of a table.")
    ] = False,
    local: Annotated[
        bool,
        typer.Option(
            "--local", help="Only the models on this Mac (Ollama, LM Studio, the HF cache)."
        ),
    ] = False,
) -> None:
    """List model pairs, and the models already on this Mac.

    Each pair of the catalog, whether it is downloaded, its size on disk, its memory
    estimate (weights plus a full-context KV cache) and whether that fits this machine.
    The catalog ships with macspec; a models.toml in the macspec home (MACSPEC_HOME, by
    default ~/Library/Application Support/macspec on macOS, ~/.local/share/macspec
    elsewhere) adds pairs or replaces them by name. Sizes are approximate.

    Then "on this Mac": every model in Ollama's store (OLLAMA_MODELS, else
    ~/.ollama/models), LM Studio's (~/.lmstudio/models, ~/.cache/lm-studio/models) and the
    Hugging Face cache, read from metadata alone, with the name --model takes. With
    --local, only those (and --json lists them).
    """
    if local:
        from macspec.cli.local_models import converted_copies, local_json, print_local
        from macspec.models.stores.listing import local_models

        found = local_models()
        if as_json:
            kept = converted_copies()
            typer.echo(json.dumps([local_json(m, found, kept) for m in found], indent=2))
        else:
            print_local(found, Console())
        return
    statuses = [pair_status(pair) for pair in load_catalog().pairs.values()]
    if as_json:
        typer.echo(json.dumps([_status_json(s) for s in statuses], indent=2))
        return
    console = Console()
    console.print(_status_table(statuses, console.width))
    notes = [(s.pair.name, note) for s in statuses for note in s.pair.unsupported]
    if notes:  # published drafters that would fail at load: said here instead
        console.print("Published drafters macspec does not serve (yet):", highlight=False)
        for name, note in notes:
            console.print(f"  {name}: {note}", highlight=False, soft_wrap=True)
    from macspec.cli.local_models import print_local
    from macspec.models.stores.listing import local_models

    print_local(local_models(), console)


# ---- macspec pull ---------------------------------------------------------------------------


def _members(catalog: Catalog, name: str) -> tuple[Pair | None, list[str]]:
    """The pair called `name` (None for a repo id) and the hub repos it is made of."""
    if hub.is_repo_id(name) and name not in catalog.pairs:
        return None, [name]
    pair = catalog.get(name)
    return pair, list(dict.fromkeys(m for m in pair.members if hub.is_repo_id(m)))


def _say_too_big(name: str, memory: MemoryEstimate, detail: str = "") -> bool:
    """One warning line on stderr when `memory` will not fit this machine; whether it was said."""
    if memory.fits is not False:
        return False
    _stderr().print(
        f"macspec: warning: {name} needs about {_gb(memory.per_rank_bytes)} of memory"
        f"{_per_rank(memory)}{detail}; this machine can give models "
        f"{_gb(memory.available_bytes)}. It may not run, or run slowly.",
        highlight=False,
    )
    return True


def _warn_memory(pair: Pair | None, repos: list[str], download_bytes: int) -> None:
    """Once the download is planned: the estimate from each model's config.json (fetched, it is
    small) for a pair the offline estimate could not size, or a lone repo's download size."""
    if pair is not None:
        configs = [hub.download_config(m) if hub.is_repo_id(m) else None for m in pair.members]
        need = estimate(int(pair.size_gb * 1e9), configs, pair.context_length, ranks=pair.ranks)
    else:
        need = estimate(download_bytes, [], 0)
    _say_too_big(pair.name if pair else repos[0], need)


def _per_rank(memory) -> str:
    return f" on each of {memory.ranks} machines" if memory.ranks > 1 else ""


def _ask_if_too_big(pair: Pair, yes: bool) -> bool | None:
    """Offline, before any download: a pair estimated not to fit is downloaded only if the
    user says so (or passed --yes). Returns the estimate's verdict (None: it could not tell)."""
    memory = pair_status(pair).memory
    detail = f" (weights + KV cache at {pair.context_length} tokens"
    detail += ", estimated)" if memory.estimated else ")"
    if not _say_too_big(pair.name, memory, detail):
        return memory.fits
    if not yes and not _confirm(
        f"Download {pair.name} (~{pair.size_gb:.1f} GB) anyway?", "nothing downloaded", "download"
    ):
        typer.echo("nothing downloaded", err=True)
        raise typer.Exit(1)
    return False


def _download_all(plans: list[hub.DownloadPlan]) -> None:
    """Download repos one after the other under one rich progress display on stderr."""
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=_stderr(), transient=False) as progress:
        for plan in plans:
            task = progress.add_task(plan.repo, total=plan.download_bytes or None)

            def report(event: hub.DownloadProgress, task=task, planned=plan.download_bytes):
                total = max(planned, event.total_bytes or 0) or None
                progress.update(task, completed=event.done_bytes, total=total)

            hub.download(plan.repo, on_progress=report)
            done = progress.tasks[task].completed or plan.download_bytes
            progress.update(task, completed=done, total=done)


@app.command("pull")
def pull(
    name: NameArg,
    yes: Annotated[
        bool, typer.Option("--yes", "-y", help="Download even a pair that will not fit, unasked.")
    ] = False,
) -> None:
    """Download a pair or one model.

    Downloads a pair's target and draft (or one repo) into the standard Hugging Face
    cache, shared with mlx-lm. Before any network work it says when a pair will not fit
    this machine's memory and asks first (unless --yes); it checks free disk space.
    Fetches only the files a model needs; after an interruption it fetches only what is
    missing, and when everything is already here it does no network work at all.
    """
    pair, repos = _members(load_catalog(), name)
    for member in pair.members if pair else ():
        if not hub.is_repo_id(member):
            hub.local_model_path(member)  # a missing package or local folder: one line
    if pair is not None and not repos:
        typer.echo(f"{pair.name} needs no download (its models ship with macspec or are local)")
        return
    missing = [repo for repo in repos if hub.cached_model_path(repo) is None]
    fits = _ask_if_too_big(pair, yes) if missing and pair is not None else None
    if missing:
        plans = [hub.plan_download(repo) for repo in missing]
        total = sum(plan.download_bytes for plan in plans)
        hub.check_disk_space(total, name)
        if fits is None:  # the offline estimate could not size it (or a lone repo): warn now
            _warn_memory(pair, repos, total)
        _download_all(plans)
    for repo in repos:
        state = "downloaded" if repo in missing else "already downloaded"
        typer.echo(f"{repo}: {state} ({hub.cached_model_path(repo)})")


# ---- macspec rm -----------------------------------------------------------------------------


def _kept_for(catalog: Catalog, pair: Pair, repo: str) -> list[str]:
    """Other downloaded pairs that still use `repo` (a draft shared between pairs)."""
    users = [
        other
        for other in catalog.pairs.values()
        if other.name != pair.name and repo in other.members
    ]
    return [other.name for other in users if pair_status(other).downloaded]


def _confirm(question: str, nothing_done: str = "nothing removed", verb: str = "remove") -> bool:
    """Ask on stdin; no answer (closed or empty stdin) counts as no."""
    try:
        return typer.confirm(question, default=False, err=True)
    except (typer.Abort, EOFError, OSError):  # closed, captured or absent stdin
        _stderr().print("", highlight=False)
        fail(f"no answer on stdin, {nothing_done} (pass --yes to {verb} without asking)")
    return False  # not reached


@app.command("rm")
def rm(
    name: NameArg,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Remove without asking.")] = False,
) -> None:
    """Remove a downloaded pair or model.

    Deletes a pair's (or one repo's) files from the Hugging Face cache. A draft that
    another downloaded pair still uses is kept. The shipped demo pair and local model
    folders are never removed.
    """
    catalog = load_catalog()
    if name not in catalog.pairs and not hub.is_repo_id(name):
        known = ", ".join(catalog.pairs) or "none"
        fail(
            f"'{name}' is no pair or Hugging Face repo: rm removes a catalog pair's downloads or "
            f"a repo from the download cache (pairs: {known}); a GGUF file or store model is "
            "never removed, its converted files go with `macspec cache clear --model NAME`"
        )
    pair, repos = _members(catalog, name)
    if pair is not None and not repos:
        fail(
            f"{pair.name} is not in the download cache (its models are package or local "
            "folders); nothing to remove"
        )
    present = [repo for repo in repos if hub.repo_cache_folder(repo).is_dir()]
    kept = {repo: _kept_for(catalog, pair, repo) for repo in present} if pair else {}
    doomed = [repo for repo in present if not kept.get(repo)]
    if not doomed:
        why = "".join(f"; {r} kept for {', '.join(kept[r])}" for r in present if kept.get(r))
        fail(f"{name} is not downloaded; nothing to remove{why}")
    sizes = {repo: hub.size_on_disk(hub.repo_cache_folder(repo)) for repo in doomed}
    listing = ", ".join(f"{repo} ({_gb(size)})" for repo, size in sizes.items())
    if not yes and not _confirm(f"Remove {listing} from {hub.hf_cache_dir()}?"):
        typer.echo("nothing removed", err=True)
        raise typer.Exit(1)
    for repo in doomed:
        freed = hub.remove_repo(repo)
        typer.echo(f"removed {repo} ({_gb(freed)})")
    for repo in present:
        if kept.get(repo):
            typer.echo(f"kept {repo} (also used by {', '.join(kept[repo])})")
