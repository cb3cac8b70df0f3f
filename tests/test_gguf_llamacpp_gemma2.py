"""gemma2 against llama.cpp beyond tests/test_gguf_llamacpp.py's ids and logits (the tiny file:
local, global, local, global layers; a window of 4; attention and final logits softcapped at
2 and 15): the config is llama.cpp's, mlx-lm's gemma2 alone (every layer global) is not, and
speculation through the window is lossless, from `macspec run` to `serve`'s batched rows."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from losslesskit import assert_batched_rows_lossless, assert_run_lookup_lossless
from mlx_lm.models import gemma2
from mlx_lm.models.cache import KVCache, RotatingKVCache
from oraclekit import greedy_steps, oracle_case
from pytest import fixture

from macspec.errors import MacspecError
from macspec.models.gguf.archs import ARCHITECTURES
from macspec.models.gguf.header import read_header

NAME = "gemma2"


@fixture(scope="module")
def loaded(tmp_path_factory):
    return oracle_case(NAME, tmp_path_factory.mktemp(NAME))


def ids_equal(recorded: dict, ours: list) -> list[int]:
    """Per prompt: how many of llama.cpp's greedy ids macspec's steps give, from the first on."""
    counts = []
    for answer, steps in zip(recorded["prompts"], ours, strict=True):
        theirs = [step["id"] for step in answer["steps"]]
        mine = [step.id for step in steps]
        counts.append(next((i for i, (a, b) in enumerate(zip(theirs, mine)) if a != b), len(mine)))
    return counts


def test_the_config_is_llamacpps(loaded):
    _, model, _, _ = loaded
    args = model.args
    assert (args.sliding_window, args.sliding_window_pattern) == (4, 2)
    assert (args.attn_logit_softcapping, args.final_logit_softcapping) == (2.0, 15.0)
    assert args.query_pre_attn_scalar == 16 and args.rope_theta == 10_000.0  # no key: defaults
    kinds = [type(cache) for cache in model.make_cache()]
    assert kinds == [RotatingKVCache, KVCache, RotatingKVCache, KVCache]  # layer 0 slides


def test_mlx_lms_gemma2_alone_is_not_llamacpps(loaded):
    """The same weights in mlx-lm's own gemma2, which attends globally on every layer: once a
    prompt outgrows the window of 4, its ids leave llama.cpp's (the window is what matters)."""
    _, model, recorded, prompts = loaded
    unwindowed = gemma2.Model(gemma2.ModelArgs.from_dict(vars(model.args)))
    unwindowed.update(model.parameters())
    steps = len(recorded["prompts"][0]["steps"])
    assert ids_equal(recorded, greedy_steps(model, prompts, steps)) == [steps] * 3
    alone = ids_equal(recorded, greedy_steps(unwindowed, prompts, steps))
    assert alone[1] < steps and alone[2] < steps  # the 7- and 20-id prompts


def test_run_answers_from_the_file_and_lookup_is_lossless(loaded, tmp_path, capsys, monkeypatch):
    """`macspec run --model FILE.gguf` (the tokenizer from the file) on a repeating raw prompt:
    lookup drafts through the window, each rejected draft rolled back, give `--no-draft`'s."""
    monkeypatch.setenv("MACSPEC_HOME", str(tmp_path))
    assert_run_lookup_lossless(loaded[0], capsys)


def test_batched_rows_are_each_the_target_alone(loaded, tok):
    """Rows of `serve`'s batch (each its own length in one cache, masked to the window per row),
    lookup drafts rolled back per row: each row is the target's own greedy answer."""
    assert_batched_rows_lossless(loaded[1], tok)


def config_with(path, **changes) -> dict:
    """macspec's config of the tiny file with its `gemma2.*` keys changed (None: left out)."""
    header = read_header(path)
    metadata = {
        k: v
        for k, v in header.metadata.items()
        if changes.get(k.removeprefix("gemma2."), 0) is not None
    }
    metadata |= {f"gemma2.{k}": v for k, v in changes.items() if v is not None}
    return ARCHITECTURES["gemma2"].config(replace(header, metadata=metadata))


def test_without_their_keys_llamacpps_defaults(loaded):
    config = config_with(
        loaded[0],
        attn_logit_softcapping=None,
        final_logit_softcapping=None,
        **{"attention.sliding_window": None},
    )
    assert (config["attn_logit_softcapping"], config["final_logit_softcapping"]) == (50.0, 30.0)
    assert (config["sliding_window"], config["sliding_window_pattern"]) == (4096, 2)


def test_27b_scales_queries_by_hidden_over_heads(loaded):
    assert config_with(loaded[0])["query_pre_attn_scalar"] == 16  # the head size
    assert config_with(loaded[0], block_count=46)["query_pre_attn_scalar"] == 32 // 4


def test_a_pattern_of_one_bool_per_layer_is_read_as_its_period(loaded):
    local = np.array([True, False, True, False])
    key = "attention.sliding_window_pattern"
    assert config_with(loaded[0], **{key: local})["sliding_window_pattern"] == 2
    with pytest.raises(MacspecError, match="not one global layer every N"):
        config_with(loaded[0], **{key: np.array([True, True, False, False])})


def test_what_llamacpps_gemma2_does_not_compute_is_one_line(loaded):
    path = loaded[0]
    with pytest.raises(MacspecError, match="local rope base .50000. apart from the global"):
        config_with(path, **{"rope.freq_base_swa": 50_000.0})
    header = read_header(path)
    untied = replace(header, tensors={**header.tensors, "output.weight": None})
    with pytest.raises(MacspecError, match="its own output.weight is not supported"):
        ARCHITECTURES["gemma2"].config(untied)
    with pytest.raises(MacspecError, match="gemma2 file with rope scaling is not supported"):
        config_with(path, **{"rope.scaling.type": "linear", "rope.scaling.factor": 2.0})
    with pytest.raises(MacspecError, match="sliding window on every layer .pattern 0."):
        config_with(path, **{"attention.sliding_window_pattern": 0})


def test_a_quantized_kv_cache_is_one_line_not_a_traceback(loaded, tmp_path, capsys, monkeypatch):
    """mlx-lm's gemma2 attention multiplies its cached keys itself: a quantized cache (tuples of
    arrays) would fail mid-answer, so --kv-bits is refused before the first pass."""
    from macspec.cli import main

    monkeypatch.setenv("MACSPEC_HOME", str(tmp_path))
    args = ["run", "hello", "--model", str(loaded[0]), "--max-tokens", "4", "--kv-bits", "8"]
    assert main([*args, "--no-draft", "--raw"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("macspec: error: --kv-bits: gemma2") and "Traceback" not in (
        "\n".join(err)
    )
