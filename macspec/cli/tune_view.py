"""What `macspec tune` shows of its training: the progress bar while it runs, and after it the
loss curve and why it stopped."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from macspec.text import counted
from macspec.tune.config import format_duration
from macspec.tune.loop import BUDGET, HELD_OUT, Check, Step, TrainRecord

BARS = "▁▂▃▄▅▆▇█"
CURVE_WIDTH = 48
"""Most checks drawn in a sparkline (evenly picked when there were more)."""
TABLE_ROWS = 8
"""Most checks listed in the table under it."""


@contextmanager
def training_bar(
    budget_s: float, max_steps: int | None, on_event: Callable[[Step | Check], None]
) -> Iterator[Callable[[Step | Check], None]]:
    """A rich progress bar on stderr, filled by the time budget spent (or the step cap
    reached, if that is further), with the step and the losses; gone once training ends."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn

    columns = (
        TextColumn("training"),
        BarColumn(),
        TextColumn("{task.fields[spent]}"),
        TextColumn("{task.description}"),
    )
    spent = f"0 s of {format_duration(budget_s)}"
    with Progress(*columns, console=Console(file=sys.stderr), transient=True) as progress:
        task = progress.add_task("step 0", total=1.0, spent=spent)
        held_out = ""

        def show(event: Step | Check) -> None:
            nonlocal held_out
            on_event(event)
            if isinstance(event, Check):
                held_out = f", held-out {event.held_out_loss:.3f}" + (
                    " (best)" if event.best else ""
                )
                return
            done = event.elapsed_s / budget_s
            if max_steps is not None:
                done = max(done, event.step / max_steps)
            progress.update(
                task,
                completed=min(1.0, done),
                description=f"step {event.step}, train loss {event.train_loss:.3f}{held_out}",
                spent=f"{format_duration(event.elapsed_s)} of {format_duration(budget_s)}",
            )

        yield show


def sparkline(values: list[float | None], low: float, high: float) -> str:
    """One bar per value on the shared scale low..high (a space where there is none)."""
    span = high - low or 1.0
    return "".join(
        " "
        if v is None or not math.isfinite(v)
        else BARS[min(len(BARS) - 1, int((v - low) / span * len(BARS)))]
        for v in values
    )


def _picked(checks: list[Check], most: int, keep: int | None = None) -> list[Check]:
    """At most `most` checks evenly spread, the first and the last always, and `keep`'s."""
    if len(checks) <= most:
        return checks
    picked = {round(i * (len(checks) - 1) / (most - 1)) for i in range(most)}
    chosen = [c for i, c in enumerate(checks) if i in picked or c.step == keep]
    return chosen


def curve_lines(record: TrainRecord) -> Iterator[str]:
    """The train and held-out loss at every check, as two sparklines on one scale and a
    short table, the kept step marked."""
    checks = record.checks
    if not checks:
        return
    drawn = _picked(checks, CURVE_WIDTH)
    train = [c.train_loss for c in drawn]
    held = [c.held_out_loss for c in drawn]
    known = [v for v in train + held if v is not None and math.isfinite(v)]
    if not known:  # a loss that is NaN throughout: nothing to draw a scale from
        yield f"loss curve: no finite loss in {counted(len(checks), 'check')}"
        return
    low, high = min(known), max(known)
    every = f"every {counted(checks[1].step - checks[0].step, 'step')}"
    every = every if len(checks) > 2 else "at the ends"
    yield f"loss curve ({counted(len(checks), 'check')}, {every}; ▁ {low:.2f} .. █ {high:.2f}):"
    first_train = next((v for v in train if v is not None), None)
    ends = f"{first_train:.2f} -> {train[-1]:.2f}" if first_train is not None else ""
    yield f"  {'train':10}{sparkline(train, low, high)}  {ends}"
    yield f"  {'held-out':10}{sparkline(held, low, high)}  {held[0]:.2f} -> {held[-1]:.2f}"
    yield f"  {'step':>8}{'train':>10}{'held-out':>10}"
    for c in _picked(checks, TABLE_ROWS, keep=record.best_step):
        train_loss = "" if c.train_loss is None else f"{c.train_loss:.3f}"
        kept = "  <- kept (lowest held-out loss)" if c.step == record.best_step else ""
        yield f"  {c.step:>8}{train_loss:>10}{c.held_out_loss:>10.3f}{kept}"


def stop_line(record: TrainRecord, budget_s: float) -> str:
    """Why training stopped, and which weights were kept."""
    budget = format_duration(budget_s)
    kept = f"kept step {record.best_step} (held-out loss {record.best_loss:.3f})"
    if record.still_improving:
        what = f"the time budget ({budget})" if record.stopped_by == BUDGET else "--steps"
        return (
            f"training: still improving when {what} ran out, after "
            f"{counted(record.steps, 'step')}: "
            f"the last check had the lowest held-out loss; {kept}; a longer "
            f"{'--time-budget' if record.stopped_by == BUDGET else '--steps'} would likely "
            "help further"
        )
    if record.stopped_by == HELD_OUT:
        since = record.steps - record.best_step
        return (
            f"training: stopped at step {record.steps}: the held-out loss had not improved "
            f"in {counted(since, 'step')}; {kept}"
        )
    what = f"the time budget ({budget})" if record.stopped_by == BUDGET else "--steps"
    return (
        f"training: {what} ran out after {counted(record.steps, 'step')}, the held-out loss "
        f"no longer improving; {kept}"
    )


def budget_overrun(record: TrainRecord, budget_s: float) -> str:
    """Why training took longer than its budget, if it did: the budget is checked between
    steps and held-out checks, so the last one ends past it; when one alone outran the whole
    budget, that one, and how long it took."""
    if record.train_s <= budget_s:
        return ""
    budget = format_duration(budget_s)
    if record.slowest_s > budget_s:
        return (
            f" (the budget is checked between steps: one {record.slowest} took "
            f"{format_duration(record.slowest_s)}, longer than the {budget} budget)"
        )
    return " (the budget is checked between steps: the last step or check ended past it)"
