"""`macspec tune`: distil the draft on the target's own answers, measured before and after."""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from macspec.cli import options as opt
from macspec.cli.app import app, fail
from macspec.errors import QuietExit

if TYPE_CHECKING:
    from macspec.tune.loop import Check, Step


@app.command()
def tune(
    out: Annotated[
        Path,
        typer.Option(
            "--out",
            "-o",
            metavar="DIR",
            help="Folder for the tuned draft (must not exist, unless --force).",
        ),
    ],
    model: opt.Model = None,
    draft_model: Annotated[
        str | None, typer.Option("--draft-model", help="The draft to tune (shares the tokenizer).")
    ] = None,
    pair: opt.PairName = None,
    prompts: Annotated[
        Path | None,
        typer.Option(
            "--prompts",
            help='JSONL, one prompt a line: {"prompt": TEXT}, {"messages": [...]} or plain text.',
        ),
    ] = None,
    from_history: Annotated[
        bool, typer.Option("--from-history", help="Tune on your stored conversations.")
    ] = False,
    held_out: Annotated[
        Path | None,
        typer.Option(
            "--held-out",
            help="Prompts to measure on (same format) [default: 10% of the prompts, at most "
            "50, never trained on].",
        ),
    ] = None,
    steps: Annotated[
        int | None,
        typer.Option(
            "--steps",
            help="At most this many training steps [default: no cap; the held-out loss and "
            "--time-budget stop it].",
        ),
    ] = None,
    time_budget: Annotated[
        str,
        typer.Option(
            "--time-budget",
            metavar="DURATION",
            help="Longest training may take, e.g. 90s, 10m, 1h30m or 1h30 (the answers and "
            "measurements come on top; checked between steps, so a slow step can end past it); "
            "training stops sooner once the held-out loss stops improving.",
        ),
    ] = "10m",
    eval_every: Annotated[
        int | None,
        typer.Option(
            "--eval-every",
            help="Steps between checks of the held-out loss [default: three times the "
            "held-out batches, at least 5].",
        ),
    ] = None,
    patience: Annotated[
        int,
        typer.Option(
            "--patience",
            help="Stop after this many checks in a row without a lower held-out loss (not "
            "before two passes over the answers, at least 10 steps and at most 1000, or "
            "--steps if fewer).",
        ),
    ] = 5,
    lora_rank: Annotated[
        int | None,
        typer.Option(
            "--lora-rank",
            help="LoRA with this rank [default: LoRA rank 8 for a draft over 50M parameters, "
            "full fine-tuning up to 50M].",
        ),
    ] = None,
    full: Annotated[
        bool,
        typer.Option(
            "--full", help="Full fine-tuning, whatever the draft's size (the default up to 50M)."
        ),
    ] = False,
    kl: Annotated[
        float,
        typer.Option(
            "--kl",
            help="Weight of KL(target top-32 || draft) in the loss, 0..1 (0: cross-entropy on "
            "the target's tokens only; suits greedy decoding).",
        ),
    ] = 0.0,
    learning_rate: Annotated[
        float | None,
        typer.Option("--learning-rate", help="Peak learning rate [default: 2e-4 LoRA, 5e-4 full]."),
    ] = None,
    batch_size: Annotated[
        int, typer.Option("--batch-size", help="Conversations per training step.")
    ] = 8,
    max_tokens: Annotated[
        int, typer.Option("--max-tokens", help="Longest answer, to train on and to measure.")
    ] = 256,
    temp: Annotated[
        float,
        typer.Option("--temp", help="Temperature of the answers and the measurements (0: greedy)."),
    ] = 0.0,
    num_draft_tokens: Annotated[
        int | None,
        typer.Option(
            "--num-draft-tokens",
            "-k",
            help="Draft length when measuring [default: the pair's fixed k, else 4].",
        ),
    ] = None,
    register: Annotated[
        str | None,
        typer.Option(
            "--register",
            help="Add a pair of this name (target + tuned draft) to your models.toml, only "
            "if the tuned draft measured better.",
        ),
    ] = None,
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="Replace an earlier tuned draft at --out (one with a tune.json)."
        ),
    ] = False,
    no_cache: Annotated[
        bool,
        typer.Option(
            "--no-cache",
            help="Generate the target's answers afresh (by default they are kept in the "
            "macspec home, and a later run on the same target, prompts and settings reuses "
            "them).",
        ),
    ] = False,
    seed: Annotated[
        int,
        typer.Option(
            "--seed", help="Seed of the held-out split, sampling, batch order and LoRA init."
        ),
    ] = 0,
) -> None:
    """Distil a draft on the target's own answers, and measure whether it got better.

    The target answers the prompts (--prompts FILE, or your stored chats with --from-history)
    with macspec's engine, greedy unless --temp. mlx-lm's tuner fine-tunes the draft on those
    answers: fully for a draft of up to 50M parameters, where that is cheap, else LoRA (QLoRA on
    a quantized draft); --full or --lora-rank N chooses, and the output says which. Training goes
    on until the loss on the target's answers to the held-out prompts stops improving (checked
    every --eval-every steps, --patience checks without a gain) or --time-budget runs out, and
    keeps the weights of the check with the lowest held-out loss; the output draws the loss
    curve and says why it stopped ("still improving when the time budget ran out": give it
    more). The result is
    fused, re-quantized to the draft's own bits and saved under --out as an mlx-lm model folder,
    written aside and renamed into place only when whole: an error, Ctrl-C or SIGTERM leaves
    nothing.
    The target's answers are kept in the macspec home as they are generated (--no-cache:
    afresh), so another run on the same target, prompts and answer settings, with another
    --learning-rate or --time-budget, goes straight to training.
    Without --pair or --model, the default pair's draft is tuned.

    Acceptance and tokens per target pass are measured on held-out prompts that are never
    trained on, before and after, at one draft length, and printed side by side with the
    training time and peak memory (tune.json in --out keeps them). Tuning may not help: then
    it says NOT better, --register adds no pair, and the old draft stays the default.
    "Better" means the paired change in tokens per pass over the held-out prompts clears two
    standard errors: a gain these prompts can tell from chance.

    \b
    Example:
      macspec tune --pair qwen2.5-7b --prompts mine.jsonl --out ~/drafts/qwen-tuned \\
        --register qwen2.5-7b-mine
    """
    if full and lora_rank is not None:
        fail("--full and --lora-rank contradict each other; pass one")
    # MLX and mlx-lm load here, not at import: `macspec --help` stays instant.
    from macspec.cli.tune_view import budget_overrun, curve_lines, stop_line
    from macspec.text import counted
    from macspec.tune.config import format_duration, parse_duration
    from macspec.tune.run import TuneConfig, iter_lines
    from macspec.tune.run import tune as run_tune

    config = TuneConfig(
        out=out,
        pair=pair,
        model=model,
        draft_model=draft_model,
        prompts=prompts,
        from_history=from_history,
        held_out=held_out,
        max_tokens=max_tokens,
        temperature=temp,
        k=num_draft_tokens,
        steps=steps,
        time_budget_s=parse_duration(time_budget),
        eval_every=eval_every,
        patience=patience,
        full=True if full else (False if lora_rank is not None else None),
        lora_rank=lora_rank if lora_rank is not None else 8,
        batch_size=batch_size,
        learning_rate=learning_rate,
        kl_weight=kl,
        register=register,
        force=force,
        cache=not no_cache,
        seed=seed,
    )
    started = time.time()
    try:
        with _ended_by_signals():
            result = run_tune(config, CliReporter())
    except (_Terminated, KeyboardInterrupt) as exc:
        signum = getattr(exc, "signum", signal.SIGINT)
        how = (
            "interrupted"
            if signum == signal.SIGINT
            else f"stopped by {signal.Signals(signum).name}"
        )
        print(f"\nmacspec: {how}: {_left_at(out, started)}", file=sys.stderr)
        raise QuietExit(128 + signum) from None
    print()
    for line in iter_lines(result):
        print(line)
    if result.identical is not None:
        same = "yes" if result.identical else "NO (a bug: please report it)"
        print(f"greedy outputs the same with either draft: {same}")
    overrun = budget_overrun(result.training, result.time_budget_s) if result.training else ""
    print(
        f"training: {result.method}, {counted(result.steps, 'step')}, "
        f"{format_duration(result.train_s)} of a {format_duration(result.time_budget_s)} budget"
        f"{overrun}; peak memory "
        f"{result.peak_memory_bytes / 1e6:.0f} MB (MLX), {result.max_rss_bytes / 1e6:.0f} MB "
        "(process)"
    )
    if result.training is not None:
        for line in curve_lines(result.training):
            print(line)
        print(stop_line(result.training, result.time_budget_s))
    print(f"saved: {out} (mlx-lm format, at the draft's own precision; tune.json has the figures)")
    b, a = result.before, result.after
    mean, error = result.change
    paired = (
        f"per held-out prompt {mean:+.2f} ± {2 * error:.2f}"
        if error is not None
        else f"{mean:+.2f} on the one held-out prompt"
    )
    undecided = "one prompt cannot tell" if error is None else "within what these prompts can tell"
    if result.verdict == "better":
        print(
            f"better: {a.tokens_per_pass:.2f} tokens per target pass instead of "
            f"{b.tokens_per_pass:.2f} ({paired})"
        )
    elif result.verdict == "worse":
        print(
            f"NOT better: {a.tokens_per_pass:.2f} tokens per target pass against "
            f"{b.tokens_per_pass:.2f} before ({paired}); keep using the old draft (it stays "
            "the default)"
        )
    else:
        print(
            f"NOT clearly better: {a.tokens_per_pass:.2f} tokens per target pass against "
            f"{b.tokens_per_pass:.2f} before ({paired}: {undecided}); "
            "keep using the old draft (it stays the default), or measure on more --held-out "
            "prompts"
        )
    for note in result.notes:
        print(note)
    if result.registered is not None:
        print(f"registered pair '{register}' in {result.registered}")
        print(f"use it: macspec chat --pair {register}")
    elif result.better and register is None:
        print(f"use it: macspec chat --model TARGET --draft-model {out}, or tune with --register")


def _left_at(out: Path, started: float) -> str:
    """What a stopped run left at --out: nothing, unless it stopped after the save (while
    registering the pair)."""
    saved = out / "tune.json"
    if saved.is_file() and saved.stat().st_mtime >= started:
        return f"the tuned draft is saved in {out}, but no pair was registered"
    return f"nothing written to {out}"


class _Terminated(BaseException):
    """SIGTERM or SIGHUP (a closed terminal): unwinds like Ctrl-C, so the staging folder goes
    and the answers finished so far stay cached; BaseException, so no `except Exception` on
    the way (mlx-lm's, ours) mistakes it for an error."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


@contextmanager
def _ended_by_signals() -> Iterator[None]:
    def end(signum, _frame) -> None:
        raise _Terminated(signum)

    previous = {s: signal.signal(s, end) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


class CliReporter:
    """Notes on stdout, progress bars on stderr (rich)."""

    def note(self, text: str) -> None:
        print(f"macspec tune: {text}", flush=True)

    @contextmanager
    def task(self, description: str, total: int):
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        columns = (
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
        )
        console = Console(file=sys.stderr)
        with Progress(*columns, console=console, transient=True) as progress:
            task = progress.add_task(description, total=total)
            yield lambda: progress.advance(task)
        print(f"macspec tune: {description}: done ({total})", flush=True)

    def training(
        self, budget_s: float, max_steps: int | None
    ) -> AbstractContextManager[Callable[[Step | Check], None]]:
        from macspec.cli.tune_view import training_bar

        return training_bar(budget_s, max_steps, self.on_training_event)

    def on_training_event(self, event: Step | Check) -> None:
        """Each training event, before the bar shows it (a hook for tests)."""
