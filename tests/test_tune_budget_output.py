"""What `macspec tune` says of its time budget and counts: the budget is checked between steps,
so a step that alone outlasts it is named with its time; one of anything is singular."""

from __future__ import annotations

import re

import pytest
from test_tune_stopping import counting, small_draft
from tunekit import run_cli, tune_args, tune_models_fixture, word_prompts, write_jsonl

from macspec.cli.tune_view import budget_overrun, stop_line
from macspec.tune import loop
from macspec.tune.loop import BUDGET, fine_tune
from macspec.tune.train import TrainSettings, prepare

models = tune_models_fixture()


def test_a_step_longer_than_the_budget_is_said(monkeypatch):
    """Each training step takes 58 s of a fake clock (checks take none): a 20 s budget stops
    training after the first, 58 s in, and the output says why it ran past."""
    now = [0.0]
    real_loss = loop.answer_loss

    def slow_loss(model, *batch):
        if model.training:  # a training step; a held-out check runs the draft in eval mode
            now[0] += 58.0
        return real_loss(model, *batch)

    monkeypatch.setattr(loop, "answer_loss", slow_loss)
    draft = small_draft()
    settings = TrainSettings(lora_rank=None, eval_every=5, time_budget_s=20.0)
    prepare(draft, settings)
    record = fine_tune(draft, counting(0, 8), counting(1, 4), settings, clock=lambda: now[0])
    assert record.stopped_by == BUDGET and record.steps == 1
    assert record.slowest == "step" and record.slowest_s == pytest.approx(58.0)
    assert record.train_s == pytest.approx(58.0)
    said = budget_overrun(record, 20.0)
    assert "checked between steps" in said
    assert "one step took 58 s, longer than the 20 s budget" in said
    assert "after 1 step," in stop_line(record, 20.0)
    # Within its budget, nothing to explain.
    assert budget_overrun(record, 60.0) == ""


def test_one_of_anything_is_singular(models, tmp_path, monkeypatch):
    monkeypatch.setenv("MACSPEC_HOME", str(tmp_path / "home"))
    one = write_jsonl(tmp_path / "one.jsonl", word_prompts(1, seed=5))
    held = write_jsonl(tmp_path / "held.jsonl", word_prompts(1, seed=6))
    args = tune_args(models, tmp_path / "draft", "weak", "--steps", 1, "--eval-every", 1)
    args[args.index(models["train"])] = one
    args[args.index(models["held_out"])] = held
    code, stdout, stderr = run_cli(*args, "--patience", 1)
    assert code == 0, stderr
    for said in (
        "1 prompt to train on, 1 held out",
        "1 held-out answer,",
        "at most 1 step of batches of 1",
        "checked every 1 step, 1 check without a gain",
        "training: full fine-tuning, 1 step, ",
    ):
        assert said in stdout
    assert not re.search(r"\b1 (steps|checks|answers|prompts|held-out answers)\b", stdout)
