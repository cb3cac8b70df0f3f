"""`macspec tune` end to end on tiny saved models: a real (seconds-long) training run that raises
acceptance on held-out prompts, a saved draft that mlx-lm loads and that stays lossless, Ctrl-C
mid-training, and every bad input (one line, exit 2, nothing written)."""

from __future__ import annotations

import collections
import contextlib
import io
import json
import os
import random
import shutil
import signal
import time
from pathlib import Path

import mlx.nn as nn
import pytest
import tiny
from losslesskit import done_of, reference
from mlx_lm.utils import load as mlx_load

from macspec.cli import main
from macspec.engine.drafters import ModelDrafter
from macspec.engine.loop import Engine, GenerationConfig
from macspec.engine.policy import FixedPolicy
from macspec.models.templates import encode_messages

MAX_TOKENS = 16
WORDS = "the cat dog ran sat on a mat and big red blue fox hat code def print for in if x y".split()


def word_prompts(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 6))) for _ in range(count)]


def write_jsonl(path: Path, prompts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tune-models")
    # A target whose next token depends mostly on the current one (its blocks' outputs scaled
    # down): what it says after a prompt can be learnt from its answers to other prompts.
    target = tiny.near_bigram(tiny.random_model(0, scale=3.0), mix=0.02)
    # The weak draft: one small layer of unrelated random weights (it accepts almost nothing).
    weak = tiny.random_model(7, tiny.model_args(hidden=32, layers=1, intermediate=64))
    quantization = {"group_size": 32, "bits": 4}
    return {
        "target": tiny.save_model(target, root / "target"),
        "weak": tiny.save_model(weak, root / "weak"),
        "quantized": tiny.save_model(
            tiny.quantized(weak, bits=4, group_size=32), root / "quantized", quantization
        ),
        "shifted": tiny.save_model(weak, root / "shifted", tokenizer_shift=7),
        "train": write_jsonl(root / "train.jsonl", word_prompts(24, seed=0)),
        "held_out": write_jsonl(root / "held_out.jsonl", word_prompts(8, seed=1)),
        # For the runs that check saving and stopping, not what tuning achieves: quicker.
        "few": write_jsonl(root / "few.jsonl", word_prompts(4, seed=2)),
        "few_held_out": write_jsonl(root / "few_held_out.jsonl", word_prompts(2, seed=3)),
    }


def run_cli(*args) -> tuple[int, str, str]:
    """`macspec ...` in this process, its stdout and stderr captured (usable at module scope)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in args])
    return code, out.getvalue(), err.getvalue()


def tune_args(models: dict[str, Path], out: Path, draft: str, *extra, few: bool = False) -> list:
    return [
        "tune",
        "--model",
        models["target"],
        "--draft-model",
        models[draft],
        "--prompts",
        models["few" if few else "train"],
        "--held-out",
        models["few_held_out" if few else "held_out"],
        "--out",
        out,
        "--max-tokens",
        MAX_TOKENS,
        "-k",
        4,
        *extra,
    ]


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
    # Not a terminal: mlx-lm's training table comes as plain text, with no escape codes.
    assert "train_loss" in stdout and "\x1b" not in stdout


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
    code, stdout, stderr = run_cli(*tune_args(models, out, "quantized", "--steps", 4, few=True))
    assert code == 0, stderr
    assert "LoRA rank 8" in stdout
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


def files_under(folder: Path) -> set[Path]:
    """Every path under `folder` but caches: the macspec home's tokenizer fingerprints (which
    loading any pair fills, `macspec run` as well), the target's answers (kept on purpose when
    a run stops: the next one reuses them), and the test's TMPDIR (where MLX's CPU backend
    keeps the kernels it compiles, the first time a test process runs one)."""
    caches = {("home",), ("home", "tokenizers"), ("home", "tune-answers.sqlite")}
    paths = {p.relative_to(folder) for p in folder.rglob("*")}
    return {p for p in paths if p.parts[:2] not in caches and p.parts[0] != "tmp"}


@pytest.mark.parametrize("stop", ["ctrl-c", "SIGTERM", "SIGHUP"])
def test_ctrl_c_mid_training_leaves_nothing_at_out(models, tmp_path, monkeypatch, stop):
    from macspec.cli.tune import CliReporter

    monkeypatch.setenv("MACSPEC_HOME", str(tmp_path / "home"))
    reports = []

    def interrupt(self, info: dict) -> None:
        reports.append(info)
        if stop == "ctrl-c":
            raise KeyboardInterrupt  # as Ctrl-C would, in the middle of mlx-lm's training loop
        os.kill(os.getpid(), getattr(signal, stop))  # a kill, or the terminal closed
        time.sleep(5)  # the handler raises before this ends

    monkeypatch.setattr(CliReporter, "train_report", interrupt)
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
    assert len(reports) == 1 and reports[0]["iteration"] < 20
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

    first = tune_into("first")
    assert len(generated) == 4 and "kept from an earlier run" not in first
    tokens = json.loads((tmp_path / "first" / "tune.json").read_text())["answer_tokens"]
    second = tune_into("second")
    cache = tmp_path / "home" / "tune-answers.sqlite"
    assert generated == [] and f"4 answers, {tokens} tokens (cache: {cache}, 4 kept from" in second
    weights = [mx.load(str(tmp_path / n / "model.safetensors")) for n in ("first", "second")]
    assert weights[0].keys() == weights[1].keys()
    assert all(mx.array_equal(weights[0][k], weights[1][k]).item() for k in weights[0])

    tune_into("longer", "--max-tokens", MAX_TOKENS + 1)  # another setting: other answers
    assert len(generated) == 4
    tune_into("fresh", "--no-cache")
    assert len(generated) == 4

    (tmp_path / "home" / "tune-answers.sqlite").write_bytes(b"not a database" * 100)
    damaged = tune_into("damaged")
    assert len(generated) == 4 and "answers not cached" in damaged and "(cache:" not in damaged


Usage = collections.namedtuple("Usage", "total used free")

BAD_INPUTS = {
    "no prompts": (["--model", "{target}", "--draft-model", "{weak}"], "no prompts"),
    "empty file": (
        ["--prompts", "{empty}", "--model", "{target}", "--draft-model", "{weak}"],
        "empty",
    ),
    "malformed line": (
        ["--prompts", "{malformed}", "--model", "{target}", "--draft-model", "{weak}"],
        "malformed.jsonl:3",
    ),
    "another tokenizer": (
        ["--prompts", "{train}", "--model", "{target}", "--draft-model", "{shifted}"],
        "tokenizers differ",
    ),
    "out exists": (
        [
            "--prompts",
            "{train}",
            "--model",
            "{target}",
            "--draft-model",
            "{weak}",
            "--out",
            "{existing}",
        ],
        "already exists and holds files that macspec tune did not write",
    ),
    "an earlier tuned draft at out, without --force": (
        ["--prompts", "{train}", "--model", "{target}", "--draft-model", "{weak}"]
        + ["--out", "{earlier}"],
        "already exists (pass --force to replace it)",
    ),
    "out exists, whatever the prompts": (
        ["--prompts", "{one}", "--model", "{target}", "--draft-model", "{weak}"]
        + ["--out", "{existing}"],
        "already exists",
    ),
    "force on a folder tune did not write": (
        ["--prompts", "{train}", "--model", "{target}", "--draft-model", "{weak}"]
        + ["--out", "{existing}", "--force"],
        "macspec tune did not write",
    ),
    "a shipped pair's name": (
        ["--prompts", "{train}", "--model", "{target}", "--draft-model", "{weak}"]
        + ["--register", "demo"],
        "the shipped catalog has a pair 'demo'",
    ),
    "too little disk": (
        ["--prompts", "{train}", "--model", "{target}", "--draft-model", "{weak}"],
        "not enough disk space",
    ),
    "an --out that cannot be made": (
        ["--prompts", "{train}", "--model", "{target}", "--draft-model", "{weak}"]
        + ["--out", "{one}/drafts/out"],
        "cannot write in",
    ),
    "no history": (
        ["--from-history", "--model", "{target}", "--draft-model", "{weak}"],
        "no stored conversations",
    ),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_one_line_exit_2_and_writes_nothing(
    models, hf_cache, tmp_path, monkeypatch, case
):
    args, needle = BAD_INPUTS[case]
    (tmp_path / "empty.jsonl").write_text("\n  \n", encoding="utf-8")
    lines = ['{"prompt": "fine"}', "plain text is fine too", '{"prompt": "cut short']
    (tmp_path / "malformed.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (tmp_path / "one.jsonl").write_text('{"prompt": "too few to hold one out"}\n')
    (tmp_path / "existing").mkdir()
    (tmp_path / "existing" / "keep.txt").write_text("mine")
    (tmp_path / "earlier").mkdir()
    (tmp_path / "earlier" / "tune.json").write_text("{}")
    if case == "too little disk":
        monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**9, 10**9 - 1000, 1000))
    names = {k: str(v) for k, v in models.items()} | {
        "empty": str(tmp_path / "empty.jsonl"),
        "malformed": str(tmp_path / "malformed.jsonl"),
        "one": str(tmp_path / "one.jsonl"),
        "existing": str(tmp_path / "existing"),
        "earlier": str(tmp_path / "earlier"),
    }
    args = [a.format(**names) for a in args]
    if "--out" not in args:
        args += ["--out", str(tmp_path / "out")]
    before = files_under(tmp_path)
    code, out, err = run_cli("tune", *args)
    assert code == 2, err
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("macspec: error:"), err
    assert needle in lines[0]
    assert files_under(tmp_path) == before
    assert (tmp_path / "existing" / "keep.txt").read_text() == "mine"


def verdict_of(before: list[tuple[int, int]], after: list[tuple[int, int]]) -> str:
    """The verdict on a tuned draft whose held-out prompts took these (tokens, passes)."""
    from macspec.tune.config import TuneResult
    from macspec.tune.measure import Measurement

    return TuneResult(
        Path("out"),
        Measurement(k=4, per_prompt=before),
        Measurement(k=4, per_prompt=after),
        1, len(before), 1, 1, "full", 1, 0.0,
        0, 0, True,
    ).verdict  # fmt: skip


def test_better_means_a_gain_the_held_out_prompts_can_tell_from_chance():
    """The demo's first tune moved tokens per pass from 2.53 to 2.54 in total: one prompt a
    little better, the next a little worse. That is no evidence: the old draft stays."""
    before = [(100, 40), (100, 40), (100, 40), (100, 40), (100, 40), (100, 40)]
    mixed = [(100, 38), (100, 42), (100, 39), (100, 41), (100, 38), (100, 41)]
    assert sum(p for _, p in mixed) < sum(p for _, p in before)  # better in total, by a hair
    assert verdict_of(before, mixed) == "unclear"
    steady = [(100, 35), (100, 34), (100, 36), (100, 35), (100, 33), (100, 35)]
    assert verdict_of(before, steady) == "better"
    assert verdict_of(steady, before) == "worse"
    assert verdict_of(before, before) == "unclear"
    # One held-out prompt has no spread to judge by: however large the change, it is no
    # evidence (and registers no pair).
    assert verdict_of(before[:1], steady[:1]) == "unclear"
    assert verdict_of(steady[:1], before[:1]) == "unclear"
