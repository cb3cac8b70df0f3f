"""`macspec bench`: plain, mlx-lm and macspec decoding side by side; the tables are in
bench_tables.py."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from macspec.bench import prompts as prompt_sets
from macspec.bench.report import plot, report, require_matplotlib, to_json
from macspec.cli import options as opt
from macspec.cli.app import app, fail
from macspec.cli.bench_tables import render, summary_lines
from macspec.cli.gguf_notes import gguf_loading
from macspec.cli.store_params import say_draft_choice
from macspec.models.catalog import context_length, resolve_models
from macspec.models.flags import DRAFT_SOURCES
from macspec.models.hub import display_name

BENCH_SOURCES = tuple(s for s in DRAFT_SOURCES if s != "auto")
"""What `--draft` may list: the drafters measured apart ('auto' picks among them per cycle)."""


def check_writable(path: Path, flag: str) -> None:
    """A file the command will write at its end: its folder must exist and take files, checked
    before the work starts rather than after it."""
    folder = path.parent
    if not folder.is_dir():
        fail(f"{flag} {path}: no folder {folder}")
    if not os.access(folder, os.W_OK):
        fail(f"{flag} {path}: cannot write in {folder}")


def parse_trees(text: str | None) -> tuple[str, ...]:
    """`--draft-tree 8,16` or 'auto' (or both): the tree sizes to run beside the chains."""
    from macspec.engine.policy.length import tree_size

    sizes = (tree_size(part) for part in (text or "").split(",") if part.strip())
    return tuple(dict.fromkeys(str(size) for size in sizes if size is not None))


def parse_ks(text: str, default: tuple[int, ...]) -> tuple[int, ...]:
    """The fixed lengths of `-k 2,3,auto`: 'auto' (the adaptive length, which always runs
    beside them) may be listed as in run, chat and serve; alone it keeps the default lengths."""
    parts = [part.strip() for part in text.split(",") if part.strip()]
    fixed = [part for part in parts if part != "auto"]
    if parts and not fixed:
        return default
    try:
        ks = tuple(dict.fromkeys(int(part) for part in fixed))
    except ValueError:
        fail(f"-k must be a comma-separated list of draft lengths such as 2,3,4, got {text!r}")
    if not ks or any(k < 1 or k > 15 for k in ks):
        fail(f"-k must list draft lengths from 1 to 15, got {text!r}")
    return ks


def _progress_bar(console: Console) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )


@app.command()
def bench(
    model: opt.Model = None,
    draft_model: opt.DraftModel = None,
    pair: opt.PairName = None,
    max_tokens: Annotated[
        int | None,
        typer.Option(
            "--max-tokens",
            help="Most tokens per answer [default: 128, 32 with --quick: a benchmark times many "
            "answers, so they are shorter than run's, chat's and serve's 512].",
        ),
    ] = None,
    temp: Annotated[
        float,
        typer.Option(
            "--temp",
            help="The sampling temperature of the sampled runs; greedy (T=0, the other commands' "
            "default) always runs too, so the bench measures both.",
        ),
    ] = 0.7,
    top_p: opt.TopP = 1.0,
    draft: Annotated[
        str | None,
        typer.Option(
            "--draft",
            help="macspec's drafters, side by side: a comma list of model, lookup, hybrid, mtp, "
            "dflash, eagle3, or 'all' (every drafter the pair has, and lookup) [default: the "
            "draft folder's kind].",
        ),
    ] = None,
    seed: Annotated[
        int, typer.Option("--seed", min=0, max=opt.MAX_SEED, help="Seed of the sampled runs.")
    ] = 0,
    kv_bits: opt.KvBits = None,
    kv_group_size: opt.KvGroupSize = 64,
    quantized_kv_start: opt.QuantizedKvStart = 0,
    max_kv_size: opt.MaxKvSize = None,
    gguf_layout: opt.GgufLayout = None,
    repeats: Annotated[int, typer.Option("--repeats", help="Passes over the prompt set.")] = 1,
    k: Annotated[
        str | None,
        typer.Option(
            "--num-draft-tokens",
            "-k",
            metavar="N[,N...]",
            help="Fixed draft lengths to compare [default: 2,3,4; 3 with --quick]. The adaptive "
            "length ('auto', the other commands' default) always runs beside them, so listing "
            "'auto' adds nothing.",
        ),
    ] = None,
    k_alias: Annotated[
        str | None, typer.Option("--k", hidden=True, help="The old name of -k.")
    ] = None,
    draft_tree: Annotated[
        str | None,
        typer.Option(
            "--draft-tree",
            metavar="N[,N...]|auto",
            help="Also run macspec with draft trees beside its chains: at most N nodes per "
            "target pass at each k, or 'auto' beside the adaptive chains.",
        ),
    ] = None,
    prompts: Annotated[
        Path | None,
        typer.Option(
            "--prompts", help='Your prompts: one per line, or JSONL with a "prompt" field.'
        ),
    ] = None,
    prompt_set: Annotated[
        str,
        typer.Option(
            "--prompt-set",
            help="Built-in prompts: 'builtin' (chat, code, summary, writing) or 'grounded' "
            "(edit this code, summarise this text: where --draft lookup shines).",
        ),
    ] = "builtin",
    verbose: Annotated[
        bool,
        typer.Option("--verbose", "-v", help="Every table, also with --quick (which summarises)."),
    ] = False,
    quick: Annotated[
        bool,
        typer.Option("--quick", help="About a minute: 4 prompts, 32 tokens, k=3; a short summary."),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print every figure as JSON.")] = False,
    plot_file: Annotated[
        Path | None,
        typer.Option(
            "--plot", help="Also draw the speedups and cost curve (PNG; needs matplotlib)."
        ),
    ] = None,
    concurrency: Annotated[
        str | None,
        typer.Option(
            "--concurrency",
            metavar="N[,N...]",
            help="Several requests at once instead: macspec's batched speculation beside "
            "mlx-lm's batched generation at each number of clients, e.g. 1,2,4,8.",
        ),
    ] = None,
) -> None:
    """Benchmark plain, mlx-lm and macspec decoding on one pair, interleaved prompt by prompt.

    Reports decode tok/s, speedup over plain decoding, acceptance, tokens per target pass,
    wasted guesses, time to first token, peak memory, whether greedy output is identical to
    plain decoding, and this device's verify-cost curve with the speedup it predicts.
    """
    from macspec.bench.plan import BenchSettings
    from macspec.bench.runner import run_bench  # MLX only once it runs
    from macspec.cli.ranks import launched, ranks
    from macspec.models.build import (
        check_distributed_source,
        choose_source,
        drafter_folders,
        load_drafters,
    )
    from macspec.models.flags import HEAD_KINDS
    from macspec.models.templates import encode_prompt

    sharded = launched()  # under mlx.launch: the target is sharded over every rank
    resolved = resolve_models(pair, model, draft_model)
    opt.gguf_layout(gguf_layout, resolved)
    say_draft_choice(resolved)
    if concurrency is not None:
        levels = parse_levels(concurrency)
        if sharded:
            fail("--concurrency: a target sharded over ranks decodes one request at a time")
        chosen = (
            prompt_sets.load_prompts(prompts)
            if prompts is not None
            else prompt_sets.builtin(quick=quick, name=prompt_set)
        )
        bench_concurrency(
            resolved, chosen, levels, max_tokens or (32 if quick else 128), draft, k, as_json
        )
        return
    folders = drafter_folders(resolved, "auto")
    if sharded:  # heads that read a sharded target's hidden states: not yet
        folders = {kind: path for kind, path in folders.items() if kind not in HEAD_KINDS}
    if draft == "all":
        sources = [k for k in ("model", *HEAD_KINDS) if k in folders] + ["lookup"]
    else:
        named = [s.strip() for s in (draft or "").split(",") if s.strip()]
        for source in named:
            if source not in (*BENCH_SOURCES, "auto"):  # auto: BenchSettings says why not
                fail(
                    f"--draft must list drafters out of {', '.join(BENCH_SOURCES)}, or be "
                    f"'all', got {source!r}"
                )
            check_distributed_source(source, sharded or None)
        sources = [choose_source(s, folders) for s in named]
        sources = list(dict.fromkeys(sources or [choose_source(None, folders)]))

    if k is not None and k_alias is not None:
        fail("pass -k/--num-draft-tokens once (--k is its old name)")
    k = k if k is not None else k_alias
    default_ks = (3,) if quick else (2, 3, 4)
    ks = parse_ks(k, default_ks) if k is not None else default_ks
    settings = BenchSettings(
        max_tokens=max_tokens if max_tokens is not None else (32 if quick else 128),
        temperature=temp,
        top_p=top_p,
        ks=ks,
        repeats=repeats,
        seed=seed,
        auto_warm=not quick,
        curve_max_m=max(8 if quick else 16, max(ks) + 1),
        curve_repeats=3 if quick else 7,
        draft_source=sources[0],
        cache_options=opt.cache_options(kv_bits, kv_group_size, quantized_kv_start, max_kv_size),
        more_sources=tuple(sources[1:]),
        trees=parse_trees(draft_tree),
    )
    chosen = (
        prompt_sets.load_prompts(prompts)
        if prompts is not None
        else prompt_sets.builtin(quick=quick, name=prompt_set)
    )
    if quick:
        chosen = chosen[:4]
    if plot_file is not None and plot_file.suffix.lower() != ".png":
        fail(f"--plot writes a PNG file; give a name ending in .png, got {plot_file}")
    if plot_file is not None:
        require_matplotlib()
    # Under mlx.launch every rank runs the same benchmark on its shard; rank 0 alone writes.
    with ranks() as here:
        group, watchdog = (None, None) if here is None else (here.group, here.watchdog)
        if group is not None:
            settings = replace(settings, ranks=group.size())
        if plot_file is not None and (here is None or here.rank == 0):  # rank 0 draws it
            check_writable(plot_file, "--plot")
        err = Console(stderr=True)
        with gguf_loading() as gguf:
            loaded = load_drafters(resolved, folders, set(sources), group)
        for warning in loaded.warnings:
            err.print(f"macspec: warning: {warning}", highlight=False)
        ids = [encode_prompt(loaded.tokenizer, p.text) for p in chosen]
        context = context_length(resolved)
        for prompt, prompt_ids in zip(chosen, ids):
            opt.check_fits(
                len(prompt_ids), context, resolved.target_name, f"prompt '{prompt.name}'"
            )
        settings = replace(settings, context_length=context)  # every tool stops there

        with _progress_bar(err) as bar:
            task = bar.add_task("loading", total=None)

            def progress(done: int, total: int, what: str) -> None:
                bar.update(task, completed=done, total=total, description=what)

            result = run_bench(loaded, ids, settings, progress, group, watchdog)
        models = {
            "target": display_name(resolved.target_name),
            "draft": display_name(resolved.draft_name),
            "target_path": str(resolved.target),
            "draft_path": str(resolved.draft),
            "pair": resolved.pair.name if resolved.pair is not None else None,
            "gguf": [conversion.to_json() for conversion in gguf],
        }
        rep = report(result, chosen, models)
        # The figures first: a plot that cannot be written after all must not lose them.
        if as_json:
            typer.echo(json.dumps(to_json(rep), indent=2))
        elif quick and not verbose:
            console = Console(width=min(Console().width, 80))  # tables fit 80 columns
            for line in summary_lines(rep):
                console.print(line, highlight=False, soft_wrap=True)
        else:
            render(rep, Console(width=min(Console().width, 80)))
        if plot_file is not None and (here is None or here.rank == 0):
            plot(rep, plot_file)
            if not as_json:
                typer.echo(f"plot: {plot_file}")


def parse_levels(text: str) -> tuple[int, ...]:
    try:
        levels = tuple(dict.fromkeys(int(part) for part in text.split(",") if part.strip()))
    except ValueError:
        fail(f"--concurrency must be a comma-separated list such as 1,2,4,8, got {text!r}")
    if not levels or any(n < 1 or n > 64 for n in levels):
        fail(f"--concurrency must list numbers of clients from 1 to 64, got {text!r}")
    return levels


def bench_concurrency(resolved, chosen, levels, max_tokens: int, draft, k, as_json: bool) -> None:
    """The --concurrency table: macspec's batch and mlx-lm's, at each number of clients."""
    from macspec.bench.concurrency import levels_json, render_levels, run_levels
    from macspec.models.build import batch_engine_for, load_for_drafting
    from macspec.models.templates import encode_prompt

    err = Console(stderr=True)
    source = None if draft in (None, "all") else draft
    with gguf_loading():
        loaded, kind, spec = load_for_drafting(resolved, k, False, source)
    for warning in loaded.warnings:
        err.print(f"macspec: warning: {warning}", highlight=False)
    ids = [encode_prompt(loaded.tokenizer, p.text) for p in chosen]

    def new_engine():
        return batch_engine_for(loaded, kind, spec)

    with _progress_bar(err) as bar:
        task = bar.add_task("loading", total=None)

        def progress(done: int, total: int, what: str) -> None:
            bar.update(task, completed=done, total=total, description=what)

        levels_run = run_levels(
            new_engine, loaded.target, loaded.tokenizer, ids, levels, max_tokens, progress
        )
    if as_json:
        typer.echo(json.dumps(levels_json(levels_run), indent=2))
    else:
        render_levels(levels_run, Console(width=min(Console().width, 100)))
