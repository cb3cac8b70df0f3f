"""gemma2 against llama.cpp beyond tests/test_gguf_llamacpp.py's ids and logits (the tiny file:
local, global, local, global layers; a window of 4; attention and final logits softcapped at
2 and 15): the config is llama.cpp's, mlx-lm's gemma2 alone (every layer global) is not, and
speculation through the window is lossless, from `macspec run` to `serve`'s batched rows."""

from __future__ import annotations

from losslesskit import assert_batched_rows_lossless, assert_run_lookup_lossless
from mlx_lm.models import gemma2
from mlx_lm.models.cache import KVCache, RotatingKVCache
from oraclekit import greedy_steps, oracle_case
from pytest import fixture

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
