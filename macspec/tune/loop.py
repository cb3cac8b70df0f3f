"""The training loop of `macspec tune`: mlx-lm's loss, batches and schedule, stepped until the
held-out loss stops improving, the time budget runs out or the step cap is reached; the best
weights by held-out loss are the ones kept.

mlx-lm's `train` runs a fixed number of steps and keeps the last weights; this loop is its step
(`value_and_grad`, the optimizer's update, compiled on Metal) with checks between steps. It
reports events to a callback and returns a record; the CLI renders both.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.tuner.trainer import iterate_batches
from mlx_lm.tuner.utils import build_schedule

from macspec.tune.examples import Example
from macspec.tune.train import (
    TrainSettings,
    answer_loss,
    distill_loss,
    iterate_distill_batches,
)

BUDGET, STEP_CAP, HELD_OUT = "the time budget", "the step cap", "the held-out loss"
"""What stopped training: the budget ran out, `max_steps` were done, or the held-out loss did
not improve for `patience` checks in a row."""


@dataclass(frozen=True)
class Step:
    """One optimizer step done."""

    step: int
    train_loss: float
    elapsed_s: float


@dataclass(frozen=True)
class Check:
    """The held-out loss after `step` steps (0: the draft as it came)."""

    step: int
    train_loss: float | None
    """Mean training loss of the steps since the previous check (None at step 0)."""
    held_out_loss: float
    best: bool
    """The lowest held-out loss so far: these weights are kept."""
    elapsed_s: float


@dataclass
class TrainRecord:
    """What the loop did: the curve, where it stopped and why, which weights it kept."""

    steps: int = 0
    best_step: int = 0
    best_loss: float = math.inf
    checks: list[Check] = field(default_factory=list)
    stopped_by: str = BUDGET
    """BUDGET, STEP_CAP or HELD_OUT."""
    train_s: float = 0.0
    slowest_s: float = 0.0
    """The longest one step or one held-out check took: the budget is checked between them,
    so training can end this much past it."""
    slowest: str = "step"
    """Which that was: 'step' or 'held-out check'."""

    def timed(self, what: str, seconds: float) -> None:
        """One step's or check's time, kept if the slowest yet."""
        if seconds > self.slowest_s:
            self.slowest_s, self.slowest = seconds, what

    @property
    def still_improving(self) -> bool:
        """The last check was the best: more steps would likely have helped."""
        return self.stopped_by != HELD_OUT and self.steps > 0 and self.best_step == self.steps

    def to_dict(self) -> dict:
        return {
            "steps": self.steps,
            "best_step": self.best_step,
            "best_held_out_loss": self.best_loss,
            "stopped_by": self.stopped_by,
            "still_improving": self.still_improving,
            "train_s": round(self.train_s, 1),
            "slowest_s": round(self.slowest_s, 1),
            "slowest": self.slowest,
            "curve": [
                {"step": c.step, "train_loss": c.train_loss, "held_out_loss": c.held_out_loss}
                for c in self.checks
            ],
        }


def fine_tune(
    draft: nn.Module,
    examples: list[Example],
    held_out: list[Example],
    settings: TrainSettings,
    report: Callable[[Step | Check], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> TrainRecord:
    """Train the draft (prepared by `prepare`) on the examples, checking its loss on the
    held-out ones every `settings.eval_every` steps; leave it holding the best weights."""
    report = report or (lambda event: None)
    np.random.seed(settings.seed)  # mlx-lm's batch order
    mx.random.seed(settings.seed)
    batch_size = min(settings.batch_size, len(examples))
    if settings.kl_weight > 0:
        dataset, loss, batches = examples, distill_loss(settings.kl_weight), iterate_distill_batches
    else:
        dataset = [(e.tokens, e.offset) for e in examples]
        loss, batches = answer_loss, iterate_batches
    optimizer = optim.Adam(learning_rate=_schedule(settings))
    loss_and_grad = nn.value_and_grad(draft, loss)
    state = [draft.state, optimizer.state, mx.random.state]

    @partial(mx.compile, inputs=state, outputs=state)
    def step(batch):
        (value, tokens), grad = loss_and_grad(draft, *batch)
        optimizer.update(draft, grad)
        return value, tokens

    def held_out_loss() -> float:
        value = held_out_loss_of(draft, held_out, settings)
        draft.train()
        return value

    record = TrainRecord()
    best_weights = _trainable(draft)
    started = clock()
    since_best = 0  # checks in a row without a better held-out loss
    losses: list[float] = []  # training losses since the last check

    def check(steps: int) -> None:
        nonlocal best_weights, since_best
        before = clock()
        value = held_out_loss()
        record.timed("held-out check", clock() - before)
        # A gain under a thousandth of the loss is noise, not learning.
        better = value < record.best_loss - 1e-3 * abs(record.best_loss)
        if better or not record.checks:
            record.best_step, record.best_loss = steps, value
            best_weights, since_best = _trainable(draft), 0
        else:
            since_best += 1
        train_loss = sum(losses) / len(losses) if losses else None
        losses.clear()
        event = Check(steps, train_loss, value, better or steps == 0, clock() - started)
        record.checks.append(event)
        report(event)

    # On MLX's CPU backend a compiled step builds its kernels with the system's C++ compiler,
    # minutes for a short run, and runs no faster after; Metal compiles in milliseconds.
    cpu_only = not mx.metal.is_available()
    if cpu_only:
        mx.disable_compile()
    draft.train()
    try:
        check(0)
        stream = batches(
            dataset=dataset,
            batch_size=batch_size,
            max_seq_length=settings.max_seq_length,
            loop=True,
        )
        while True:
            if settings.max_steps is not None and record.steps >= settings.max_steps:
                record.stopped_by = STEP_CAP
                break
            if clock() - started >= settings.time_budget_s:
                break
            before = clock()
            value, _ = step(next(stream))
            mx.eval(state, value)
            now = clock()
            record.timed("step", now - before)
            record.steps += 1
            losses.append(value.item())
            report(Step(record.steps, losses[-1], now - started))
            if record.steps % settings.eval_every == 0:
                check(record.steps)
                if since_best >= settings.patience and record.steps >= settings.min_steps:
                    record.stopped_by = HELD_OUT
                    break
        if record.checks[-1].step != record.steps:
            check(record.steps)  # the last weights, checked too
    finally:
        if cpu_only and not os.environ.get("MLX_DISABLE_COMPILE"):
            mx.enable_compile()
    record.train_s = clock() - started
    draft.update(tree_unflatten(list(best_weights.items())))
    draft.eval()
    mx.eval(draft.parameters())
    return record


def held_out_loss_of(draft: nn.Module, held_out: list[Example], settings: TrainSettings) -> float:
    """The training loss over every held-out example (token-weighted), in batches of at most
    `settings.batch_size` of similar lengths."""
    draft.eval()
    ordered = sorted(held_out, key=lambda e: len(e.tokens))
    total, tokens = mx.array(0.0), mx.array(0)
    for start in range(0, len(ordered), settings.batch_size):
        chunk = ordered[start : start + settings.batch_size]
        if settings.kl_weight > 0:
            batch = next(iterate_distill_batches(chunk, len(chunk), settings.max_seq_length))
            value, count = distill_loss(settings.kl_weight)(draft, *batch)
        else:
            rows = [(e.tokens, e.offset) for e in chunk]
            batch = next(iterate_batches(rows, len(rows), settings.max_seq_length))
            value, count = answer_loss(draft, *batch)
        total, tokens = total + value * count, tokens + count
    mx.eval(total, tokens)
    return (total / tokens).item() if tokens.item() else math.nan


def _trainable(draft: nn.Module) -> dict[str, mx.array]:
    """The trainable weights by name (MLX arrays are immutable: the optimizer's update makes
    new ones, so holding these keeps this step's weights without a copy)."""
    return dict(tree_flatten(draft.trainable_parameters()))


def _schedule(settings: TrainSettings):
    """A short warmup, then a cosine decay to a tenth over `max_steps` when there is a step
    cap; without one (the length is the held-out loss's and the budget's to decide) the peak
    rate stays."""
    lr = settings.learning_rate
    if settings.max_steps is None:
        warmup = settings.warmup
        return lambda step: lr * mx.minimum(1.0, (step + 1) / max(1, warmup))
    warmup = min(settings.warmup, settings.max_steps // 10)
    return build_schedule(
        {"name": "cosine_decay", "arguments": [lr, settings.max_steps, lr / 10], "warmup": warmup}
    )
