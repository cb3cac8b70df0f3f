"""`macspec tune` on GGUF files: a GGUF target's answers train a quantized GGUF draft, and the
tuned draft is a plain mlx-lm folder with its own weights (not a pointer back to the file)."""

from __future__ import annotations

import json
import math

import mlx.core as mx
import pytest
import tiny
from gguf import GGMLQuantizationType
from ggufkit import write_gguf
from mlx.utils import tree_flatten
from mlx_lm import load as mlx_load
from tunekit import run_cli, word_prompts, write_jsonl

from macspec.models.gguf.folder import GGUF_KEY


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf-tune")
    target = tiny.near_bigram(tiny.random_model(0, scale=3.0), mix=0.02)
    draft = tiny.random_model(7, tiny.model_args(hidden=32, layers=1, intermediate=64))
    files = {
        "target": write_gguf(target, tiny.llama_config(target), root / "target.gguf"),
        "draft": write_gguf(
            draft,
            tiny.llama_config(draft),
            root / "draft.gguf",
            float_type=GGMLQuantizationType.Q8_0,
        ),
        "out": root / "tuned",
    }
    code, out, err = run_cli(
        "tune", "--model", files["target"], "--draft-model", files["draft"],
        "--prompts", write_jsonl(root / "train.jsonl", word_prompts(8, seed=0)),
        "--held-out", write_jsonl(root / "held.jsonl", word_prompts(2, seed=1)),
        "--out", files["out"], "--max-tokens", 12, "-k", 4,
    )  # fmt: skip
    assert code == 0, err
    return files


def test_the_tuned_gguf_draft_is_an_mlx_lm_folder_with_its_own_weights(tuned):
    config = json.loads((tuned["out"] / "config.json").read_text())
    assert GGUF_KEY not in config  # else it would load the file's weights, not the tuned ones
    assert config["quantization"]["bits"] == 8 and config["quantization"]["group_size"] == 32
    model, _ = mlx_load(str(tuned["out"]))  # mlx-lm alone reads it
    saved = dict(tree_flatten(model.parameters()))
    from macspec.models import hub
    from macspec.models.loader import load_model

    original, _ = load_model(hub.local_model_path(str(tuned["draft"])), "model")
    before = dict(tree_flatten(original.parameters()))
    assert saved.keys() == before.keys()
    assert any(not mx.array_equal(saved[name], before[name]).item() for name in saved)


def test_the_tuned_draft_drafts_for_the_gguf_target_losslessly(tuned):
    runs = {}
    for draft in (["--draft-model", tuned["out"], "-k", "4"], ["--no-draft"]):
        code, out, err = run_cli(
            "run", "--json", "--raw", "--model", tuned["target"], *draft,
            "--max-tokens", 24, "the cat sat on",
        )  # fmt: skip
        assert code == 0, err
        runs[draft[0]] = json.loads(out)
    assert runs["--draft-model"]["tokens"] == runs["--no-draft"]["tokens"]
    assert runs["--draft-model"]["stats"]["draft_proposed"] > 0


def test_full_fine_tuning_of_a_float16_draft_keeps_finite_float16_weights(tuned):
    """A GGUF's Q8_0 layers dequantize to float16: trained in float16, Adam's first steps
    overflowed and the 'tuned' draft held NaN; it trains in float32 and is saved as it was."""
    record = json.loads((tuned["out"] / "tune.json").read_text())
    losses = [c["held_out_loss"] for c in record["stopping"]["curve"]]
    assert len(losses) > 1 and all(math.isfinite(v) for v in losses)
    model, _ = mlx_load(str(tuned["out"]))
    for name, value in tree_flatten(model.parameters()):
        assert not mx.isnan(value).any().item(), name
        if name.endswith("scales"):
            assert value.dtype == mx.float16, name  # quantized again as the file had it
