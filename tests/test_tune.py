"""`macspec tune` end to end on tiny saved models: a real (seconds-long) training run that raises
acceptance on held-out prompts, a saved draft that mlx-lm loads and that stays lossless, Ctrl-C
mid-training, a second run reusing the answers (bad input and the verdict: test_tune_inputs.py)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import mlx.nn as nn
import pytest
from losslesskit import done_of, reference
from mlx_lm.utils import load as mlx_load
from tunekit import (
    MAX_TOKENS,
    files_under,
    run_cli,
    tune_args,
    tune_models_fixture,
)

from macspec.engine.drafters.model import ModelDrafter
from macspec.engine.generate.loop import Engine, GenerationConfig
from macspec.engine.policy.length import FixedPolicy
from macspec.models.templates import encode_messages
from macspec.tune.loop import Step

models = tune_models_fixture()


@pytest.fixture(scope="module")
def tuned(models, tmp_path_factory):
    """One full fine-tuning run of the weak draft, through the CLI."""
    out = tmp_path_factory.mktemp("tuned") / "draft"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MACSPEC_HOME", str(out.parent / "home"))
        args = tune_args(models, out, "weak", "--full", "--steps", 60, "--learning-rate", 3e-3)
        args += ["--register", "tiny-tuned"]
        code, stdout, stderr = run_cli(*args)
    assert code == 0, stderr
    return out, stdout, json.loads((out / "tune.json").read_text())


def held_out_ids(models, tokenizer, few: bool) -> list[list[int]]:
    lines = models["few_held_out" if few else "held_out"].read_text(encoding="utf-8").splitlines()
    messages = [[{"role": "user", "content": json.loads(line)["prompt"]}] for line in lines]
    return [encode_messages(tokenizer, m) for m in messages]


def assert_lossless(models, draft_folder: Path, few: bool = False) -> None:
    """Speculative decoding with the saved draft gives mlx-lm's own target-only greedy output."""
    target, tokenizer = mlx_load(str(models["target"]))
    draft, _ = mlx_load(str(draft_folder))
    for prompt in held_out_ids(models, tokenizer, few):
        engine = Engine(target, tokenizer, ModelDrafter(draft), FixedPolicy(4))
        config = GenerationConfig(max_tokens=MAX_TOKENS)
        done = done_of(engine.generate(prompt, config))
        assert done.tokens == reference(target, prompt, MAX_TOKENS)


def test_tuning_raises_acceptance_on_held_out_prompts(models, tuned):
    out, stdout, record = tuned
    before, after = record["before"], record["after"]
    assert record["held_out_prompts"] == 8 and record["train_prompts"] == 24
    assert before["k"] == after["k"] == 4
    assert before["acceptance"] < 0.1  # the weak draft really is weak
    assert after["acceptance"] > before["acceptance"] + 0.3
    assert after["tokens_per_pass"] > before["tokens_per_pass"] + 1.0
    assert record["better"] and record["identical_greedy_outputs"]
    assert record["verdict"] == "better"
    assert record["change_in_tokens_per_pass"]["mean"] > 2 * max(
        record["change_in_tokens_per_pass"]["standard_error"], 0.0
    )
    # The figures the user reads are those of the record.
    assert f"{'acceptance':24}{before['acceptance']:>10.2f}{after['acceptance']:>10.2f}" in stdout
    assert "better: " in stdout and "NOT better" not in stdout
    assert f"saved: {out}" in stdout
    # --steps caps the steps; the curve is drawn, as plain text (not a terminal).
    assert record["stopping"]["steps"] <= 60 and "loss curve (" in stdout
    assert "\x1b" not in stdout


def test_the_defaults_alone_make_a_tiny_random_draft_better(models, tmp_path, monkeypatch):
    """Told neither --full nor --lora-rank, tune trains a draft this small fully, says so and
    why, and its defaults (train until the held-out loss stops improving) make it "better" on
    the held-out prompts:
    more so than LoRA at rank 8, the default for large drafts, which cannot retrain the
    embeddings a random draft must learn."""
    monkeypatch.setenv("MACSPEC_HOME", str(tmp_path / "home"))
    code, stdout, stderr = run_cli(*tune_args(models, tmp_path / "default", "weak"))
    assert code == 0, stderr
    assert (
        "training: full fine-tuning (the default for a draft of 0.03M parameters, at most "
        "50M: cheap to train whole; --lora-rank N for LoRA)"
    ) in stdout
    record = json.loads((tmp_path / "default" / "tune.json").read_text())
    assert record["verdict"] == "better" and "\nbetter: " in stdout
    assert record["training"]["method_chosen_by"] == "the draft's size"
    assert record["training"]["draft_parameters"] == 25_952 == record["training"]["trainable"]
    code, _, stderr = run_cli(*tune_args(models, tmp_path / "lora", "weak", "--lora-rank", 8))
    assert code == 0, stderr
    lora = json.loads((tmp_path / "lora" / "tune.json").read_text())
    # Both trained until their held-out loss stopped improving: LoRA stops far higher.
    assert record["stopping"]["stopped_by"] == lora["stopping"]["stopped_by"] == "the held-out loss"
    best = record["stopping"]["best_held_out_loss"]
    assert best < lora["stopping"]["best_held_out_loss"] - 1.0
    gain = record["change_in_tokens_per_pass"]["mean"]
    assert gain > lora["change_in_tokens_per_pass"]["mean"]
    assert record["after"]["acceptance"] > lora["after"]["acceptance"] + 0.1


def test_a_quantized_draft_is_sized_by_its_unquantized_weights(models):
    """The size the method is chosen by counts a 4-bit layer's packed words as the 8 weights
    each holds, not as one parameter (and not its scales and biases)."""
    from macspec.tune.train import parameter_count

    weak, _ = mlx_load(str(models["weak"]))
    quantized, _ = mlx_load(str(models["quantized"]))
    assert parameter_count(weak) == parameter_count(quantized) == 25_952


def test_a_better_draft_is_registered_as_a_pair(models, tuned, monkeypatch):
    """--register adds the target and the tuned draft to the user's models.toml, usable by
    name at once (`macspec models` lists it); the same name again is one line, exit 2."""
    out, stdout, _ = tuned
    monkeypatch.setenv("MACSPEC_HOME", str(out.parent / "home"))
    from macspec.models.catalog import load_catalog

    pair = load_catalog().get("tiny-tuned")
    assert pair.target == str(models["target"]) and Path(pair.draft) == out.resolve()
    assert pair.draft_policy == 4
    code, listing, _ = run_cli("models", "--json")
    assert code == 0 and "tiny-tuned" in {row["name"] for row in json.loads(listing)}
    again = tune_args(models, out.parent / "again", "weak", "--full", "--register", "tiny-tuned")
    code, _, stderr = run_cli(*again)
    assert code == 2 and "already has a pair 'tiny-tuned'" in stderr
    assert not (out.parent / "again").exists()


def test_force_replaces_an_existing_out_only_once_the_new_draft_is_whole(models, tmp_path):
    out = tmp_path / "drafts" / "draft"
    out.mkdir(parents=True)
    (out / "tune.json").write_text("{}")  # an earlier tuned draft
    (out / "old.txt").write_text("its weights")
    code, _, stderr = run_cli(*tune_args(models, out, "weak", "--full", "--steps", 2))
    assert code == 2 and "--force" in stderr and (out / "old.txt").exists()
    code, _, stderr = run_cli(*tune_args(models, out, "weak", "--full", "--steps", 2, "--force"))
    assert code == 0, stderr
    assert not (out / "old.txt").exists() and (out / "config.json").is_file()
    assert {p.name for p in out.parent.iterdir()} == {"draft"}  # no staging or backup left
    # A folder the Finder opened, otherwise empty, is empty.
    finder = tmp_path / "finder"
    finder.mkdir()
    (finder / ".DS_Store").write_bytes(b"\0")
    code, _, stderr = run_cli(*tune_args(models, finder, "weak", "--full", "--steps", 2, "--force"))
    assert code == 0, stderr


def test_saved_draft_loads_with_mlx_lm_and_stays_lossless(models, tuned):
    out, _, _ = tuned
    # no staging left (the home holds the models.toml that --register wrote)
    assert {p.parts[0] for p in files_under(out.parent)} - {"home"} == {"draft"}
    draft, tokenizer = mlx_load(str(out))
    assert tokenizer.get_vocab() == mlx_load(str(models["weak"]))[1].get_vocab()
    assert not any(isinstance(m, nn.QuantizedLinear) for _, m in draft.named_modules())
    assert_lossless(models, out)


def test_lora_on_a_quantized_draft_saves_it_quantized_as_it_was(models, tmp_path, monkeypatch):
    monkeypatch.setenv("MACSPEC_HOME", str(tmp_path / "home"))
    out = tmp_path / "lora"
    args = tune_args(models, out, "quantized", "--steps", 4, "--lora-rank", 8, few=True)
    code, stdout, stderr = run_cli(*args)
    assert code == 0, stderr
    assert "training: LoRA rank 8, " in stdout  # chosen by the user: no default to explain
    config = json.loads((out / "config.json").read_text())
    assert config["quantization"] == {"group_size": 32, "bits": 4}
    draft, _ = mlx_load(str(out))
    layers = (nn.Linear, nn.Embedding, nn.QuantizedLinear, nn.QuantizedEmbedding)
    linears = [m for _, m in draft.named_modules() if isinstance(m, layers)]
    assert linears and all(
        isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding)) for m in linears
    )
    assert all(m.bits == 4 and m.group_size == 32 for m in linears)
    assert_lossless(models, out, few=True)


@pytest.mark.parametrize("stop", ["ctrl-c", "SIGTERM", "SIGHUP"])
def test_ctrl_c_mid_training_leaves_nothing_at_out(models, tmp_path, monkeypatch, stop):
    from macspec.cli.tune import CliReporter

    monkeypatch.setenv("MACSPEC_HOME", str(tmp_path / "home"))
    reports = []

    def interrupt(self, event) -> None:
        if not isinstance(event, Step):
            return  # the check of the draft as it came
        reports.append(event)
        if stop == "ctrl-c":
            raise KeyboardInterrupt  # as Ctrl-C would, in the middle of mlx-lm's training loop
        os.kill(os.getpid(), getattr(signal, stop))  # a kill, or the terminal closed
        time.sleep(5)  # the handler raises before this ends

    monkeypatch.setattr(CliReporter, "on_training_event", interrupt)
    work = tmp_path / "work"
    work.mkdir()
    before = files_under(tmp_path)
    code, _, stderr = run_cli(
        *tune_args(models, work / "new" / "draft", "weak", "--steps", 20, few=True)
    )
    if stop == "ctrl-c":
        assert code == 130, stderr
        assert stderr.strip().splitlines()[-1] == (
            f"macspec: interrupted: nothing written to {work / 'new' / 'draft'}"
        )
    else:
        assert code == 128 + getattr(signal, stop), stderr
        assert stderr.strip().splitlines()[-1] == (
            f"macspec: stopped by {stop}: nothing written to {work / 'new' / 'draft'}"
        )
    assert len(reports) == 1 and reports[0].step == 1
    assert files_under(tmp_path) == before  # not --out, not its parent, no staging folder


def test_a_second_run_reuses_the_targets_answers_and_trains_the_same(models, tmp_path, monkeypatch):
    """Answers (and the target's log-probabilities) are kept in the macspec home: a run with the
    same target, prompts and answer settings generates none, and trains to the same weights; a
    changed setting, --no-cache or a damaged cache file generates them again."""
    import mlx.core as mx

    from macspec.tune import answers

    monkeypatch.setenv("MACSPEC_HOME", str(tmp_path / "home"))
    generated = []
    real_generate = answers.Engine.generate

    def counting(self, prompt, config):
        if self.drafter is None:  # the target alone: an answer (measuring drafts as well)
            generated.append(list(prompt))
        return real_generate(self, prompt, config)

    monkeypatch.setattr(answers.Engine, "generate", counting)
    train = ["--full", "--steps", 4, "--learning-rate", 1e-3, "--kl", 0.5]

    def tune_into(name: str, *extra) -> str:
        generated.clear()
        code, stdout, stderr = run_cli(
            *tune_args(models, tmp_path / name, "weak", *train, *extra, few=True)
        )
        assert code == 0, stderr
        return stdout

    first = tune_into("first")  # 4 training answers, 2 held-out ones (for the held-out loss)
    assert len(generated) == 6 and "kept from an earlier run" not in first
    tokens = json.loads((tmp_path / "first" / "tune.json").read_text())["answer_tokens"]
    second = tune_into("second")
    cache = tmp_path / "home" / "tune-answers.sqlite"
    assert generated == [] and f"4 answers, {tokens} tokens (cache: {cache}, 4 kept from" in second
    assert "2 held-out answers, " in second and ", 2 kept from an earlier run)" in second
    weights = [mx.load(str(tmp_path / n / "model.safetensors")) for n in ("first", "second")]
    assert weights[0].keys() == weights[1].keys()
    assert all(mx.array_equal(weights[0][k], weights[1][k]).item() for k in weights[0])

    tune_into("longer", "--max-tokens", MAX_TOKENS + 1)  # another setting: other answers
    assert len(generated) == 6
    tune_into("fresh", "--no-cache")
    assert len(generated) == 6

    (tmp_path / "home" / "tune-answers.sqlite").write_bytes(b"not a database" * 100)
    damaged = tune_into("damaged")
    assert len(generated) == 6 and "answers not cached" in damaged and "(cache:" not in damaged
