"""EAGLE-3 heads against mlx-vlm 0.7.10's `eagle3` drafter, on the same random weights.

Our engine runs a few speculative cycles with the head while a recorder keeps what each cycle
proposed and the draft-vocabulary logits behind it (tests/test_drafter_fidelity.py's Recorder).
For every cycle mlx-vlm's drafter then drafts from scratch for the same committed text: a fresh
cache prefilled from the tapped layers of a fresh target pass (taken here by hand at the layers
mlx-vlm captures, not by macspec's taps), then its own draft block. Drafts and logits must be
equal; the draft vocabulary (200 ids) is smaller than the target's (260), so d2t matters.

mlx-vlm reads only the speculators format: the EAGLE-format head is compared through the
translation the issue measured (ids + 1, `midlayer.` -> `layers.0.`), which is what checks our
reading of EAGLE's 0-based ids. Each wrong variant below must make the comparison fail.
"""

from __future__ import annotations

import json

import eagle3kit as kit
import mlx.core as mx
import pytest
from mlx_lm.models.base import create_attention_mask
from mlx_vlm.speculative.drafters.eagle3 import Eagle3DraftModel
from mlx_vlm.speculative.drafters.eagle3 import ModelConfig as VlmConfig
from test_drafter_fidelity import ATOL, K, run_cycles

from macspec.engine.drafters.eagle3 import Eagle3Drafter
from macspec.models.eagle3 import load_eagle3

TAPS = (0, 1, 2)
"""0-based target layers (speculators ids [1, 2, 3]) of the 4-layer qwen3 target."""


def reference_for(folder, target) -> Eagle3DraftModel:
    """mlx-vlm's drafter on the folder's weights (an EAGLE-format folder translated)."""
    config = json.loads((folder / "config.json").read_text())
    weights = mx.load(str(folder / "model.safetensors"))
    if "eagle_config" in config:
        ids = config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
        config = {
            "speculators_model_type": "eagle3",
            "transformer_layer_config": kit.layer_config(target),
            "draft_vocab_size": config["draft_vocab_size"],
            "norm_before_residual": config["norm_before_residual"],
            "eagle_aux_hidden_state_layer_ids": [i + 1 for i in ids],
        }
        weights = {k.replace("midlayer.", "layers.0."): v for k, v in weights.items()}
    reference = Eagle3DraftModel(VlmConfig.from_dict(config))
    reference.load_weights(list(reference.sanitize(weights).items()), strict=False)
    return reference.bind(target)


def tapped(target, ids: list[int], layers: list[int]) -> mx.array:
    """(1, len(ids), layers x D) outputs of the target's decoder layers, by a plain pass."""
    inner = target.model
    h = inner.embed_tokens(mx.array(ids)[None])
    mask = create_attention_mask(h, None)
    outputs = []
    for layer in inner.layers:
        h = layer(h, mask, None)
        outputs.append(h)
    return mx.concatenate([outputs[i] for i in layers], axis=-1)


def recording(logits, reference, into: list):
    """mlx-vlm's `_logits`, noting each result in `into`."""

    def record(h):
        into.append(logits(reference, h))
        return into[-1]

    return record


def mismatches(target, recorder, reference) -> int:
    """Cycles whose guesses or logits differ from mlx-vlm's drafter on the same context."""
    bad = 0
    layers = list(reference.config.capture_layer_ids)
    real_logits = Eagle3DraftModel._logits
    for context, draft, logits in recorder.cycles:
        guesses = list(draft.tokens)
        if not guesses:
            continue
        n = len(context)
        hidden = tapped(target, context[: n - 1], layers)
        cache = reference.reset(target)
        want_logits: list[mx.array] = []
        reference._logits = recording(real_logits, reference, want_logits)
        ids = mx.array(context[: n - 1])[None]
        reference.prefill_from_target_hidden(ids, hidden, context[-1], None, greedy=True)
        want = reference.draft_block(
            context[-1], hidden[:, -1:], cache, len(guesses) + 1, None, greedy=True
        )
        del reference._logits
        same = want[0].tolist() == guesses and all(
            mx.allclose(a, b.reshape(a.shape), atol=ATOL).item()
            for a, b in zip(logits, want_logits)
        )
        bad += not same
    return bad


@pytest.fixture(scope="module")
def target():
    return kit.qwen3_target()


@pytest.fixture(scope="module", params=["speculators", "eagle"])
def folder(request, target, tmp_path_factory):
    weights = kit.randomised(target, TAPS)
    return kit.save_folder(
        target, tmp_path_factory.mktemp(request.param), weights, TAPS, form=request.param
    )


def test_eagle3_drafts_and_logits_equal_mlx_vlm(tok, target, folder):
    head = load_eagle3(folder, kit.target_config(target))
    recorder = run_cycles(tok, target, Eagle3Drafter(head, target), max_tokens=16)
    proposed = [len(d.tokens) for _, d, _ in recorder.cycles]
    assert len(proposed) >= 4 and max(proposed) == K
    assert mismatches(target, recorder, reference_for(folder, target)) == 0


class D2tNotApplied(Eagle3Drafter):
    def _to_target(self, draft_ids):
        return draft_ids


class D2tAppliedTwice(Eagle3Drafter):
    def _to_target(self, draft_ids):
        once = super()._to_target(draft_ids)
        return mx.minimum(once + self.head.d2t[draft_ids], kit.tiny.VOCAB - 1)


@pytest.mark.parametrize(
    "variant",
    [
        "taps one layer off",
        "d2t not applied",
        "d2t applied twice",
        "norm_before_residual ignored",
        "head cache never rolled back",
    ],
)
def test_each_wrong_variant_is_caught(tok, target, tmp_path, monkeypatch, variant):
    weights = kit.randomised(target, TAPS)
    good = kit.save_folder(target, tmp_path / "good", weights, TAPS)
    config = kit.target_config(target)
    drafter_class = {"d2t not applied": D2tNotApplied, "d2t applied twice": D2tAppliedTwice}
    if variant == "taps one layer off":
        shifted = tuple(t + 1 for t in TAPS)
        head = load_eagle3(kit.save_folder(target, tmp_path / "off", weights, shifted), config)
    else:
        head = load_eagle3(good, config)
    if variant == "norm_before_residual ignored":
        monkeypatch.setattr(head.layers[0], "norm_before_residual", False)
    if variant == "head cache never rolled back":
        monkeypatch.setattr(Eagle3Drafter, "_trim", lambda self, pairs: None)
    drafter = drafter_class.get(variant, Eagle3Drafter)(head, target)
    recorder = run_cycles(tok, target, drafter, max_tokens=16)
    assert mismatches(target, recorder, reference_for(good, target)) > 0
