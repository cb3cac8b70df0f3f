"""Fidelity to the reference implementations, on the same random weights.

macspec's MTP drafts and logits equal mlx-vlm's `qwen3_5_mtp` drafter's; its DFlash block
logits equal z-lab's MLX reference's (the `dflash` package). Both references run here on
`mlx[cpu]` (installed from tests/peers.txt). Acceptance alone hides mistakes, so each wrong
variant below must make the comparison fail: MTP fed the pre-norm hidden state, an MTP cache
never rolled back, later MTP steps fed the target's last state, DFlash taps one layer off, a
causal DFlash block.

How it is compared: our engine runs a few speculative cycles with the drafter while a recorder
keeps what each cycle proposed and the logits it proposed from. For every cycle the reference
then drafts from scratch for the same committed text: a fresh cache fed the whole context, with
hidden states from a fresh target pass over it. Equal logits mean our incremental caches, taps
and rollbacks hold what they should.
"""

from __future__ import annotations

import mlx.core as mx
import pytest
import tiny
from dflash.model_mlx import DFlashConfig as ZLabConfig
from dflash.model_mlx import DFlashDraftModel as ZLabDraft
from dflash.model_mlx import _patch_model
from mlx_lm.models.cache import KVCache, make_prompt_cache
from mlx_vlm.speculative.drafters.qwen3_5_mtp import ModelConfig as VlmConfig
from mlx_vlm.speculative.drafters.qwen3_5_mtp import Qwen3_5MTPDraftModel

from macspec.engine.core import taps as taps_module
from macspec.engine.drafters.dflash import DFlashDrafter
from macspec.engine.drafters.mtp import MTPDrafter
from macspec.engine.drafters.protocol import Draft
from macspec.engine.generate.loop import Engine, GenerationConfig
from macspec.engine.policy.length import FixedPolicy
from macspec.models.drafters import load_dflash, load_mtp

PROMPT = "The quick brown fox jumps over"
K = 3
ATOL = 1e-4


class Recorder:
    """Wraps a drafter: notes each cycle's context, guesses and the logits behind them."""

    def __init__(self, drafter):
        self.drafter = drafter
        self.cycles: list[tuple[list[int], Draft, list[mx.array]]] = []
        self.logits: list[mx.array] = []
        head = drafter.lm_head

        def recording_head(x):
            out = head(x)
            self.logits.append(out)
            return out

        drafter.lm_head = recording_head

    def __getattr__(self, name):
        return getattr(self.drafter, name)

    def propose(self, context, k, params, key, floor):
        self.logits = []
        draft = self.drafter.propose(context, k, params, key, floor)
        # The engine reads the guesses with its verdict, then sets draft.tokens to them.
        self.cycles.append((list(context), draft, self.logits))
        return draft


def run_cycles(tok, target, drafter, max_tokens: int = 14) -> Recorder:
    recorder = Recorder(drafter)
    engine = Engine(target, tok, recorder, FixedPolicy(K))
    list(engine.generate(tok.encode(PROMPT), GenerationConfig(max_tokens=max_tokens)))
    return recorder


def post_norm_hidden(target, ids: list[int]) -> mx.array:
    """The target's final post-norm hidden states over ids, by a fresh pass."""
    return target.language_model.model(mx.array(ids)[None], make_prompt_cache(target))


# -- MTP against mlx-vlm ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def mtp_setup(tmp_path_factory):
    target = tiny.near_bigram(tiny.arch_model("qwen3_5", 0, scale=3.0), mix=0.02)
    norm = target.language_model.model.norm  # not all ones: post-norm differs from pre-norm
    norm.weight = 1.0 + 0.5 * mx.random.normal(norm.weight.shape)
    config = tiny.CONFIGS[id(target)]
    folder = tiny.save_mtp_folder(
        target, tmp_path_factory.mktemp("mtp"), noise=0.005, reads_hidden=0.3
    )
    reference = Qwen3_5MTPDraftModel(
        VlmConfig.from_dict({"model_type": "qwen3_5_mtp", "text_config": dict(config)})
    )
    reference.load_weights(list(mx.load(str(folder / "model.safetensors")).items()))
    reference.bind(target)
    return target, load_mtp(folder, config), reference


def mtp_mismatches(target, recorder, reference) -> int:
    """Cycles whose guesses or logits differ from mlx-vlm's drafter on the same context."""
    bad = 0
    for context, draft, logits in recorder.cycles:
        guesses = list(draft.tokens)
        n = len(context)
        hidden = post_norm_hidden(target, context[: n - 1])  # h_0 .. h_{n-2}
        cache = [KVCache() for _ in reference.layers]
        ids = mx.array(context[1:n])[None]  # pair i: (x_{i+1}, h_i)
        h = reference._forward_hidden(
            reference._input_embed(ids), hidden, cache, mx.arange(n - 1)[None]
        )[:, -1:]
        want_logits, want = [], []
        for step in range(len(guesses)):
            out = reference._lm_head_fn(h)[0]
            want_logits.append(out)
            want.append(int(mx.argmax(out, axis=-1).item()))
            if step + 1 < len(guesses):
                position = mx.array([[n - 1 + step]])
                h = reference._forward_hidden(
                    reference._input_embed(mx.array([[want[-1]]])), h, cache, position
                )
        same = want == guesses and all(
            mx.allclose(a, b, atol=ATOL).item() for a, b in zip(logits, want_logits)
        )
        bad += not same
    return bad


def test_mtp_drafts_and_logits_equal_mlx_vlm(tok, mtp_setup):
    target, head, reference = mtp_setup
    recorder = run_cycles(tok, target, MTPDrafter(head, target))
    assert len(recorder.cycles) >= 4
    proposed = [len(d.tokens) for _, d, _ in recorder.cycles]
    assert max(proposed) == K
    assert mtp_mismatches(target, recorder, reference) == 0


def test_mtp_fed_the_pre_norm_hidden_state_is_caught(tok, mtp_setup, monkeypatch):
    target, head, reference = mtp_setup
    real = taps_module.inner_model

    class PreNorm:  # the tap meant for the final norm lands on the last decoder layer
        def __init__(self, model):
            self.norm = real(model).layers[-1]

    monkeypatch.setattr(taps_module, "inner_model", lambda model: PreNorm(model))
    recorder = run_cycles(tok, target, MTPDrafter(head, target))
    assert mtp_mismatches(target, recorder, reference) > 0


def test_an_mtp_cache_never_rolled_back_is_caught(tok, mtp_setup, monkeypatch):
    target, head, reference = mtp_setup
    monkeypatch.setattr(MTPDrafter, "_trim", lambda self, pairs: None)
    recorder = run_cycles(tok, target, MTPDrafter(head, target))
    assert mtp_mismatches(target, recorder, reference) > 0


def test_later_mtp_steps_fed_the_targets_last_state_are_caught(tok, mtp_setup, monkeypatch):
    target, head, reference = mtp_setup

    class LastTargetState(MTPDrafter):
        def _feedback(self, out):
            return self.hidden.get(self.exact - 1, self.exact)

    recorder = run_cycles(tok, target, LastTargetState(head, target))
    assert mtp_mismatches(target, recorder, reference) > 0


# -- DFlash against z-lab -------------------------------------------------------------------------
LAYERS = (0, 1)


@pytest.fixture(scope="module")
def dflash_setup(tmp_path_factory):
    target = tiny.arch_model("qwen3", 0, scale=3.0)
    config = tiny.CONFIGS[id(target)]
    folder = tiny.save_dflash_folder(tmp_path_factory.mktemp("dflash"), target_layer_ids=LAYERS)
    twin = tiny.arch_model("qwen3", 0, scale=3.0)  # the same weights, patched by z-lab
    full = tiny.dflash_config(target_layer_ids=LAYERS)
    # z-lab's config from the very dict the drafter folder was written with
    shared = (
        "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
        "head_dim", "intermediate_size", "rms_norm_eps", "rope_theta",
        "max_position_embeddings", "block_size", "num_target_layers",
    )  # fmt: skip
    reference = ZLabDraft(
        ZLabConfig(
            **{key: full[key] for key in shared},
            vocab_size=tiny.VOCAB,
            target_layer_ids=LAYERS,
            mask_token_id=full["dflash_config"]["mask_token_id"],
        )
    )
    reference.load_weights(list(mx.load(str(folder / "model.safetensors")).items()))
    reference.bind(twin)
    _patch_model(twin, list(LAYERS))
    return target, config, folder, twin, reference


def dflash_mismatches(recorder, twin, reference) -> int:
    bad = 0
    block = reference.config.block_size
    mask = reference.config.mask_token_id
    for context, draft, logits in recorder.cycles:
        guesses = list(draft.tokens)
        n = len(context)
        twin(mx.array(context[: n - 1])[None], make_prompt_cache(twin))
        hidden = mx.concatenate(twin._hidden_states, axis=-1)
        ids = mx.array([[context[-1]] + [mask] * (block - 1)])
        cache = reference.make_cache()
        want = reference(ids, hidden, cache, logits_start=1)[0, : len(guesses)]
        got = logits[0][: len(guesses)] if logits else mx.zeros((0,))
        bad += (
            not (got.shape == want.shape and mx.allclose(got, want, atol=ATOL).item())
            or guesses != mx.argmax(want, axis=-1).tolist()
        )
    return bad


def test_dflash_block_logits_equal_zlab(tok, dflash_setup):
    target, config, folder, twin, reference = dflash_setup
    recorder = run_cycles(tok, target, DFlashDrafter(load_dflash(folder, config), target))
    assert len(recorder.cycles) >= 4
    assert dflash_mismatches(recorder, twin, reference) == 0


def test_dflash_taps_one_layer_off_are_caught(tok, dflash_setup, tmp_path):
    target, config, _, twin, reference = dflash_setup
    shifted = tiny.save_dflash_folder(tmp_path / "shifted", target_layer_ids=(1, 2))
    recorder = run_cycles(tok, target, DFlashDrafter(load_dflash(shifted, config), target))
    assert dflash_mismatches(recorder, twin, reference) > 0


def test_a_causal_dflash_block_is_caught(tok, dflash_setup, monkeypatch):
    target, config, folder, twin, reference = dflash_setup
    model = load_dflash(folder, config)
    for layer in model.layers:
        monkeypatch.setattr(layer.self_attn, "causal", True)
    recorder = run_cycles(tok, target, DFlashDrafter(model, target))
    assert dflash_mismatches(recorder, twin, reference) > 0
