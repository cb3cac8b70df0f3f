"""Shared by the `macspec tune` tests: tiny saved models and prompt files, the CLI run in this
process, and what a run left on disk."""

from __future__ import annotations

import contextlib
import io
import json
import random
from pathlib import Path

import pytest
import tiny

from macspec.cli import main

MAX_TOKENS = 16
WORDS = "the cat dog ran sat on a mat and big red blue fox hat code def print for in if x y".split()


def word_prompts(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 6))) for _ in range(count)]


def write_jsonl(path: Path, prompts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts), encoding="utf-8")
    return path


def tune_models_fixture():
    """The module-scoped fixture `models`: a target, drafts (weak, quantized, another
    tokenizer) and prompt files, for `models = tune_models_fixture()` at a test module's top."""

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

    return models


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


def files_under(folder: Path) -> set[Path]:
    """Every path under `folder` but caches: the macspec home's tokenizer fingerprints (which
    loading any pair fills, `macspec run` as well), the target's answers (kept on purpose when
    a run stops: the next one reuses them), and the test's TMPDIR (where MLX's CPU backend
    keeps the kernels it compiles, the first time a test process runs one)."""
    caches = {("home",), ("home", "tokenizers"), ("home", "tune-answers.sqlite")}
    paths = {p.relative_to(folder) for p in folder.rglob("*")}
    return {p for p in paths if p.parts[:2] not in caches and p.parts[0] != "tmp"}
