"""The step before which the held-out loss stops nothing: two passes over the answers, at least
10 steps, at most 1000, never past --steps; the output, --help and the docs say the same."""

from __future__ import annotations

from pathlib import Path

import pytest
from tunekit import run_cli, tune_args, tune_models_fixture

from macspec.tune.config import FLOOR_LEAST, FLOOR_MOST, held_out_floor

models = tune_models_fixture()
DOCS = Path(__file__).parent.parent / "docs" / "bench-and-tune.md"


@pytest.mark.parametrize(
    ("examples", "batch", "cap", "floor", "why"),
    [
        (4, 8, None, 10, "at least 10 steps, though two passes over the answers take 2"),
        (24, 2, None, 24, "two passes over the answers"),
        (4000, 4, None, 1000, "at most 1000 steps, though two passes over the answers take 2000"),
        (24, 2, 7, 7, "--steps"),
    ],
)
def test_the_floor_and_why(examples, batch, cap, floor, why):
    assert held_out_floor(examples, batch, cap) == (floor, why)


def test_the_output_help_and_docs_say_the_floor_the_code_uses(models, tmp_path, monkeypatch):
    monkeypatch.setenv("MACSPEC_HOME", str(tmp_path / "home"))
    args = tune_args(models, tmp_path / "draft", "weak", "--time-budget", "1s", few=True)
    code, stdout, stderr = run_cli(*args)
    assert code == 0, stderr
    # four prompts: two passes are two batches of four, under the floor of ten steps
    said = "not before step 10: at least 10 steps, though two passes over the answers take 2"
    assert said in stdout
    code, help_text, _ = run_cli("tune", "--help")
    assert code == 0
    docs = " ".join(DOCS.read_text(encoding="utf-8").split())
    for text in (" ".join(help_text.replace("│", " ").split()), docs):
        assert "two passes over the answers" in text
        assert f"at least {FLOOR_LEAST} steps" in text and f"{FLOOR_MOST}" in text
