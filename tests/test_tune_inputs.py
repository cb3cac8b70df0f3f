"""`macspec tune`'s bad input (one line, exit 2, nothing written) and its verdict on a tuned
draft (better only by a gain the held-out prompts can tell from chance)."""

from __future__ import annotations

import collections
import shutil
from pathlib import Path

import pytest
from tunekit import files_under, run_cli, tune_models_fixture

from macspec.errors import MacspecError
from macspec.tune.prompts import history_prompts, parse_line

models = tune_models_fixture()


Usage = collections.namedtuple("Usage", "total used free")

TRAIN = ["--prompts", "{train}", "--model", "{target}", "--draft-model", "{weak}"]
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
        TRAIN + ["--out", "{earlier}"],
        "already exists (pass --force to replace it)",
    ),
    "out exists, whatever the prompts": (
        ["--prompts", "{one}", "--model", "{target}", "--draft-model", "{weak}"]
        + ["--out", "{existing}"],
        "already exists",
    ),
    "force on a folder tune did not write": (
        TRAIN + ["--out", "{existing}", "--force"],
        "macspec tune did not write",
    ),
    "a shipped pair's name": (
        TRAIN + ["--register", "demo"],
        "the shipped catalog has a pair 'demo'",
    ),
    "too little disk": (
        ["--prompts", "{train}", "--model", "{target}", "--draft-model", "{weak}"],
        "not enough disk space",
    ),
    "an --out that cannot be made": (
        TRAIN + ["--out", "{one}/drafts/out"],
        "cannot write in",
    ),
    "no checks of the held-out loss": (
        TRAIN + ["--eval-every", "0"],
        "--eval-every must be >= 1, got 0",
    ),
    "no patience": (
        TRAIN + ["--patience", "0"],
        "--patience must be >= 1, got 0",
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


def test_a_prompt_of_whitespace_is_content_only_nothing_is_empty():
    """The rule of every path: a JSON prompt of whitespace is a prompt; one of no characters
    is an error naming its line (a blank line of the file is skipped, as before)."""
    assert parse_line('{"prompt": "  \\n"}', "p.jsonl:1").messages == (("user", "  \n"),)
    assert parse_line('" "', "p.jsonl:2").messages == (("user", " "),)
    with pytest.raises(MacspecError, match=r"^p.jsonl:3: the prompt is empty$"):
        parse_line('{"prompt": ""}', "p.jsonl:3")
    history = history_prompts([[("user", " "), ("assistant", "ok"), ("user", "")]])
    assert [p.messages[-1] for p in history] == [("user", " ")]
