"""Granite 4.0 H from a GGUF file (granitehybrid: Mamba2 and attention layers) keeps speculation
lossless: lookup- and model-drafted greedy answers on the tiny file of tests/oraclekit.py (the
one llama.cpp's answer is recorded for) are the target alone's, guesses rejected included (the
Mamba layers' conv and SSM states rolled back to the accepted prefix each cycle)."""

from __future__ import annotations

import mlx.core as mx
import pytest
from losslesskit import done_of, reference
from mlx.utils import tree_map
from oraclekit import ARCHS, prompts, rebuilt

from macspec.engine.drafters.lookup import LookupDrafter
from macspec.engine.drafters.model import ModelDrafter
from macspec.engine.generate.loop import Engine, GenerationConfig
from macspec.engine.policy.length import FixedPolicy
from macspec.errors import MacspecError
from macspec.models import hub
from macspec.models.build import build_engine
from macspec.models.catalog import ResolvedModels
from macspec.models.gguf.archs.granite_hybrid import GraniteHybrid
from macspec.models.loader import load_model

MAX_TOKENS = 24


@pytest.fixture(scope="module")
def granite(tmp_path_factory):
    """The tiny file's target loaded as `--model FILE.gguf` loads it, a draft of the same file
    with its weights perturbed (it agrees often, not always), and a prompt that repeats itself
    (lookup finds guesses in it)."""
    folder = tmp_path_factory.mktemp("granite")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MACSPEC_HOME", str(folder / "home"))
        path = rebuilt("granitehybrid", folder)
        derived = hub.local_model_path(str(path))
        _, loaded = build_engine(
            ResolvedModels(derived, None, str(path), None, None), no_draft=True
        )
        draft, _ = load_model(derived, "draft model")
    mx.random.seed(1)
    draft.update(
        tree_map(lambda w: w + 0.05 * w.std() * mx.random.normal(w.shape), draft.parameters())
    )
    mx.eval(draft.parameters())
    prompt = prompts(ARCHS["granitehybrid"].seed)[2]
    return loaded, draft, prompt[:10] * 3


def test_the_file_is_a_mamba_and_attention_hybrid(granite):
    loaded, _, _ = granite
    kinds = [type(cache).__name__ for cache in loaded.target.make_cache()]
    assert kinds == ["ArraysCache", "KVCache", "ArraysCache", "KVCache"]


@pytest.mark.parametrize("kind", ["lookup", "model"])
def test_drafted_greedy_answers_are_the_targets_own(granite, kind):
    loaded, draft, prompt = granite
    alone = reference(loaded.target, prompt, MAX_TOKENS, eos=loaded.tokenizer.eos_token_ids)
    drafter = LookupDrafter() if kind == "lookup" else ModelDrafter(draft)
    engine = Engine(loaded.target, loaded.tokenizer, drafter, FixedPolicy(4))
    done = done_of(engine.generate(prompt, GenerationConfig(max_tokens=MAX_TOKENS)))
    plain = done_of(
        Engine(loaded.target, loaded.tokenizer).generate(
            prompt, GenerationConfig(max_tokens=MAX_TOKENS)
        )
    )
    assert len(alone) == MAX_TOKENS
    assert done.tokens == plain.tokens == alone
    # guesses were made, and some refused: the recurrent states were rolled back
    assert 0 < done.stats.draft_accepted or kind == "lookup"
    assert done.stats.draft_proposed > done.stats.draft_accepted


def test_the_shared_experts_halves_are_joined_gate_first_or_refused_in_one_line():
    arch = GraniteHybrid()
    gate, up = mx.zeros((2, 8)), mx.ones((2, 8))
    joined = arch.fused({"blk.3.ffn_gate_shexp.weight": gate, "blk.3.ffn_up_shexp.weight": up})
    assert list(joined) == ["blk.3.ffn_gate_up_shexp.weight"]
    assert joined["blk.3.ffn_gate_up_shexp.weight"].tolist() == [[0.0] * 8] * 2 + [[1.0] * 8] * 2
    assert arch.mlx_name("blk.3.ffn_gate_up_shexp.weight") == (
        "model.layers.3.shared_mlp.input_linear.weight"
    )
    mixed = {"blk.3.ffn_gate_shexp.weight": gate, "blk.3.ffn_up_shexp.weight": up[:, :4]}
    with pytest.raises(MacspecError, match="stored in different types"):
        arch.fused(mixed)
