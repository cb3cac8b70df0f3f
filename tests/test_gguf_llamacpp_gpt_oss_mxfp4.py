"""gpt-oss with MXFP4 experts, as the published files hold them (GptOssModel.repack_mxfp4 writes
the checkpoint's experts as ggml's MXFP4 blocks; tests/oraclekit.py's `gpt-oss-mxfp4`, the rest
F32). macspec reads them as MLX's `mxfp4` mode, bit for bit (kquants).

llama.cpp's CPU answer (tests/fixtures/llamacpp/gpt-oss-mxfp4.json) differs by design: ggml
multiplies MXFP4 weights by activations it first rounds to Q8_0 (ggml-cpu's `vec_dot_type`
of MXFP4), macspec by float32 ones. Measured: max logit difference 0.32 and 44/48 ids (a prompt
takes another id where llama.cpp's top two are 0.14 apart). With that rounding emulated on the
experts' inputs, macspec is llama.cpp's answer within the float tests' tolerance: the MXFP4 bits
are read right. Without it, macspec is the same model with the experts dequantized by gguf to
float32."""

from __future__ import annotations

import gguf
import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten
from mlx_lm.models import switch_layers
from oraclekit import greedy_steps, oracle_case
from test_gguf_llamacpp import LOGIT_TOLERANCE, max_logit_difference

from macspec.models.gguf.archs.gpt_oss import GptOss

NAME = "gpt-oss-mxfp4"
TWIN_TOLERANCE = 1e-4
"""macspec's mxfp4 matmuls against float32 ones on the same values: only the order of the
float32 additions may differ (measured 0.0 on MLX's CPU)."""


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    return oracle_case(NAME, tmp_path_factory.mktemp(NAME))


def q8_0(x: mx.array) -> mx.array:
    """ggml's quantize_row_q8_0 and back: per 32 values, d = max|x| / 127 (stored as fp16),
    x rounded to a multiple of it."""
    groups = x.reshape(*x.shape[:-1], -1, 32)
    d = mx.abs(groups).max(axis=-1, keepdims=True) / 127
    q = mx.round(groups * mx.where(d > 0, 1 / d, 0))
    return (q * d.astype(mx.float16).astype(mx.float32)).reshape(x.shape)


def test_with_llamacpps_q8_0_activations_the_answer_is_llamacpps(loaded, monkeypatch):
    _, model, recorded, prompts = loaded
    plain = switch_layers.QuantizedSwitchLinear.__call__

    def rounded_input(self, x, indices, sorted_indices=False):
        return plain(self, q8_0(x), indices, sorted_indices)

    monkeypatch.setattr(switch_layers.QuantizedSwitchLinear, "__call__", rounded_input)
    ours = greedy_steps(model, prompts, len(recorded["prompts"][0]["steps"]))
    for answer, steps in zip(recorded["prompts"], ours, strict=True):
        assert [step.id for step in steps] == [step["id"] for step in answer["steps"]]
    assert max_logit_difference(recorded, ours) <= LOGIT_TOLERANCE
    assert recorded["smallest_top2_gap"] > 2 * LOGIT_TOLERANCE


def test_the_experts_are_mlx_mxfp4_and_compute_as_gguf_dequantized(loaded):
    path, model, recorded, prompts = loaded
    experts = {
        f"{GptOss().mlx_name(t.name).removesuffix('.weight')}": mx.array(
            gguf.quants.dequantize(t.data, t.tensor_type)
        )
        for t in gguf.GGUFReader(path).tensors
        if t.tensor_type == gguf.GGMLQuantizationType.MXFP4
    }
    assert len(experts) == 3 * model.args.num_hidden_layers
    for module, _ in experts.items():
        layer = model
        for part in module.split("."):
            layer = layer[int(part)] if part.isdigit() else getattr(layer, part)
        assert isinstance(layer, switch_layers.QuantizedSwitchLinear)
        assert (layer.mode, layer.bits, layer.group_size) == ("mxfp4", 4, 32)
    weights = {
        name: value
        for name, value in tree_flatten(model.parameters())
        if name.removesuffix(".weight").removesuffix(".scales") not in experts
        or name.endswith(".bias")
    }
    weights |= {f"{module}.weight": value for module, value in experts.items()}
    twin = type(model)(model.args)  # the same class unquantized: float32 experts
    twin.load_weights(list(weights.items()), strict=True)
    steps = len(recorded["prompts"][0]["steps"])
    ours, theirs = greedy_steps(model, prompts, steps), greedy_steps(twin, prompts, steps)
    worst = 0.0
    for mine, float_steps in zip(ours, theirs, strict=True):
        assert [step.id for step in mine] == [step.id for step in float_steps]
        for a, b in zip(mine, float_steps, strict=True):
            worst = max(worst, float(np.abs(a.logits - b.logits).max()))
    assert worst <= TWIN_TOLERANCE
