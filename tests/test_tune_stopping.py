"""When `macspec tune` stops training and which weights it keeps: the held-out loss stops it
once it no longer improves, the time budget stops it otherwise (and the output says it was
still improving), and the weights kept are those of the lowest held-out loss seen."""

from __future__ import annotations

import json
import random

import pytest
import tiny
from tunekit import run_cli, tune_args, tune_models_fixture

from macspec.tune.examples import Example
from macspec.tune.loop import BUDGET, HELD_OUT, Check, Step, fine_tune, held_out_loss_of
from macspec.tune.train import TrainSettings, prepare

models = tune_models_fixture()


def small_draft():
    return tiny.random_model(7, tiny.model_args(hidden=32, layers=1, intermediate=64))


def counting(seed: int, count: int) -> list[Example]:
    """Runs of counting (each id the last plus one, mod 40) from random starts: the draft can
    learn the rule, so its loss on other runs falls with training."""
    rng = random.Random(seed)
    runs = []
    for _ in range(count):
        start = rng.randrange(40)
        runs.append(Example([(start + i) % 40 for i in range(24)], 4))
    return runs


def noise(seed: int, count: int) -> list[Example]:
    """Random ids among the first 40: all a draft can learn for other runs is that only
    those come; trained hard on a few runs it then memorises them, and its loss on others
    rises."""
    rng = random.Random(seed)
    return [Example([rng.randrange(40) for _ in range(24)], 4) for _ in range(count)]


def step_clock():
    """A clock that reads one second per optimizer step (the training's own report of its
    steps moves it): a budget of N seconds is N steps, on any machine."""
    steps = [0]

    def report(event):
        if isinstance(event, Step):
            steps[0] = event.step

    return (lambda: float(steps[0])), report


def test_training_stops_when_the_held_out_loss_stops_improving_and_keeps_the_best():
    """Memorising noise: the held-out loss falls at first (to the 40 ids that come), then
    rises; training stops `patience` checks after its lowest point, well
    within the budget, and the draft ends with that point's weights, not the last ones."""
    draft = small_draft()
    train, held_out = noise(0, 8), noise(1, 8)
    settings = TrainSettings(
        lora_rank=None, learning_rate=3e-3, eval_every=5, patience=3, time_budget_s=120.0
    )
    prepare(draft, settings)
    events = []
    record = fine_tune(draft, train, held_out, settings, events.append)

    assert record.stopped_by == HELD_OUT and not record.still_improving
    losses = [c.held_out_loss for c in record.checks]
    assert record.best_loss == min(losses) and 0 < record.best_step < record.steps
    assert record.steps == record.best_step + 3 * 5  # three checks after the best, no more
    assert all(c.held_out_loss >= record.best_loss for c in record.checks[-3:])
    assert record.train_s < 120
    # The draft holds the kept weights: its held-out loss is the lowest the checks saw.
    assert held_out_loss_of(draft, held_out, settings) == pytest.approx(record.best_loss, 1e-5)
    assert held_out_loss_of(draft, held_out, settings) < losses[-1] - 0.01
    # The events are the record's checks, and one step event per step.
    assert [e for e in events if isinstance(e, Check)] == record.checks
    assert [e.step for e in events if isinstance(e, Step)] == list(range(1, record.steps + 1))


def test_the_held_out_loss_stops_nothing_before_min_steps():
    """The same noise with `min_steps`: training runs on to that step though the held-out loss
    rose long before, then stops at the first check there, keeping the early best."""
    draft = small_draft()
    settings = TrainSettings(
        lora_rank=None,
        learning_rate=3e-3,
        eval_every=5,
        patience=3,
        min_steps=42,
        time_budget_s=120.0,
    )
    prepare(draft, settings)
    record = fine_tune(draft, noise(0, 8), noise(1, 8), settings)
    assert record.stopped_by == HELD_OUT and record.steps == 45
    assert record.best_step < 42 - 3 * 5  # patience ran out long before


def test_the_budget_stops_training_that_is_still_improving():
    draft = small_draft()
    settings = TrainSettings(
        lora_rank=None, learning_rate=3e-3, eval_every=5, patience=3, time_budget_s=30.0
    )
    prepare(draft, settings)
    clock, report = step_clock()
    record = fine_tune(draft, counting(0, 16), counting(1, 8), settings, report, clock)
    assert record.stopped_by == BUDGET and record.steps == 30
    assert record.still_improving and record.best_step == 30
    losses = [c.held_out_loss for c in record.checks]
    assert [c.step for c in record.checks] == [0, 5, 10, 15, 20, 25, 30]
    assert losses[-1] < losses[0] - 0.5
    assert held_out_loss_of(draft, counting(1, 8), settings) == pytest.approx(losses[-1], 1e-5)


def test_the_step_cap_stops_it_too():
    draft = small_draft()
    settings = TrainSettings(lora_rank=None, max_steps=7, eval_every=5, time_budget_s=120.0)
    prepare(draft, settings)
    record = fine_tune(draft, counting(0, 16), counting(1, 8), settings)
    assert record.steps == 7 and [c.step for c in record.checks] == [0, 5, 7]
    assert record.stopped_by == "the step cap"


def test_the_cli_says_it_was_still_improving_and_draws_the_curve(models, tmp_path, monkeypatch):
    """A budget of one second on a draft that has far to go: the output states the budget,
    the steps, the curve of both losses, and that it was still improving."""
    monkeypatch.setenv("MACSPEC_HOME", str(tmp_path / "home"))
    out = tmp_path / "draft"
    args = tune_args(models, out, "weak", "--time-budget", "1s", "--eval-every", 2)
    code, stdout, stderr = run_cli(*args)
    assert code == 0, stderr
    record = json.loads((out / "tune.json").read_text())
    stopping = record["stopping"]
    steps = stopping["steps"]
    assert stopping["stopped_by"] == "the time budget" and stopping["still_improving"]
    assert record["training"]["time_budget_s"] == 1.0
    assert "until the held-out loss stops improving (checked every 2 steps" in stdout
    assert f"training: full fine-tuning, {steps} steps, " in stdout and " of a 1 s budget" in stdout
    assert "training: still improving when the time budget (1 s) ran out, after " in stdout
    assert f"kept step {steps} (held-out loss " in stdout
    curve = stdout[stdout.index("loss curve") :].splitlines()
    assert curve[1].lstrip().startswith("train ") and curve[2].lstrip().startswith("held-out ")
    first, last = stopping["curve"][0], stopping["curve"][-1]
    assert f"{first['held_out_loss']:.2f} -> {last['held_out_loss']:.2f}" in curve[2]
    assert "\x1b" not in stdout  # not a terminal: no escape codes


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("0", "--time-budget must be longer than 0 s, got '0'"),
        ("-5m", "--time-budget must be a duration such as 90s, 10m, 1h or 1h30m, got '-5m'"),
        ("soon", "--time-budget must be a duration such as 90s, 10m, 1h or 1h30m, got 'soon'"),
    ],
)
def test_a_bad_budget_is_one_line_exit_2(models, tmp_path, value, needle):
    code, stdout, stderr = run_cli(
        *tune_args(models, tmp_path / "o", "weak", "--time-budget", value)
    )
    assert code == 2 and stdout == ""
    assert stderr.strip() == f"macspec: error: {needle}"
    assert not (tmp_path / "o").exists()
