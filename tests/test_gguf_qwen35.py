"""A qwen35 GGUF file (tests/oraclekit.py's tiny Qwen3.5: Gated DeltaNet, full attention, an MTP
layer; llama.cpp's answer on it is tests/fixtures/llamacpp/qwen35.json) keeps macspec's hybrid
cache rollback: drafted runs are the target's own greedy answer. Its MTP layer is the MTP
drafter's (test_gguf_qwen35_mtp.py), not a notice."""

from __future__ import annotations

import mlx.core as mx
import pytest
from oraclekit import rebuilt, write_tiny_gguf

from macspec.engine.generate.loop import Engine, GenerationConfig
from macspec.engine.policy.length import FixedPolicy
from macspec.models import hub
from macspec.models.build import build_engine, make_drafter
from macspec.models.gguf.archs import notices
from macspec.models.gguf.archs.qwen35 import Qwen35
from macspec.models.gguf.header import read_header
from macspec.models.resolved import ResolvedModels

MAX_TOKENS = 12
PARTS = ("weight", "scales", "biases")
PROMPT = [9707, 11, 1879, 0, 358, 1079, 264, 1273, 9707, 11, 1879, 0]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The tiny qwen35 file as `--model`, drafted for by another qwen35 file (other weights:
    most drafts rejected, so the recurrent state is rolled back on most passes)."""
    folder = tmp_path_factory.mktemp("qwen35")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MACSPEC_HOME", str(folder / "home"))
        target = rebuilt("qwen35", folder)
        other = write_tiny_gguf("qwen35", tmp_path_factory.mktemp("draft"), seed=11)
        resolved = ResolvedModels(
            hub.local_model_path(str(target)),
            hub.local_model_path(str(other)),
            str(target),
            str(other),
            None,
        )
        _, loaded = build_engine(resolved)
        yield target, loaded


def answer(loaded, drafter) -> tuple[list[int], object]:
    engine = Engine(loaded.target, loaded.tokenizer, drafter, FixedPolicy(3) if drafter else None)
    done = list(engine.generate(PROMPT, GenerationConfig(max_tokens=MAX_TOKENS)))[-1]
    return done.tokens, done.stats


@pytest.mark.parametrize("kind", ["model", "lookup"])
def test_drafted_greedy_is_the_targets_own(models, kind):
    _, loaded = models
    plain, _ = answer(loaded, None)
    drafted, stats = answer(loaded, make_drafter(kind, loaded))
    assert len(plain) == MAX_TOKENS and drafted == plain
    if kind == "model":  # drafts were proposed, and some rolled back
        assert 0 < stats.draft_proposed and stats.draft_accepted < stats.draft_proposed


def test_the_mtp_layer_is_no_notice(models):
    target, _ = models
    assert notices(read_header(target)) == []


@pytest.mark.parametrize("bits, group_size", [(4, 32), (8, 64), (6, 64)])
def test_quantized_out_projection_columns_are_ungrouped_as_the_floats(bits, group_size):
    """ssm_out's columns are value heads: in the compact layout they stay packed, and whole
    groups of each head's columns (128 wide in Qwen3.5) move as its floats would."""
    k_heads, v_heads, head_dim = 2, 4, 128
    floats = mx.random.normal((16, v_heads * head_dim), key=mx.random.key(0))
    config = {"linear_num_key_heads": k_heads, "linear_num_value_heads": v_heads}
    config["linear_key_head_dim"] = head_dim
    arch, name = Qwen35(), "blk.0.ssm_out"
    packed = mx.quantize(floats, group_size=group_size, bits=bits)
    moved = [arch.undo(f"{name}.{kind}", part, config) for kind, part in zip(PARTS, packed)]
    expected = mx.quantize(arch.undo(f"{name}.weight", floats, config), group_size, bits)
    for ours, theirs in zip(moved, expected, strict=True):
        assert mx.array_equal(ours, theirs)
    assert not mx.array_equal(moved[0], packed[0])  # the heads did move
