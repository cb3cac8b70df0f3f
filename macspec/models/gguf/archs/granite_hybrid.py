"""granitehybrid (IBM Granite 4.0 H: Micro, Tiny, Small) as mlx-lm's `granitemoehybrid`.

convert_hf_to_gguf.py's GraniteHybridModel (conversion/granite.py, with Mamba2Model of
conversion/mamba.py) writes Mamba2 mixers and attention layers in one file; a layer is a
Mamba layer where the per-layer `attention.head_count_kv` is 0 (as llama.cpp reads it). Undone
here: `ssm_a` holds A = -exp(A_log) with a trailing axis (read back as A_log), `ssm_d` one too,
`ssm_conv1d` lost the conv's middle axis (mlx-lm's Conv1d wants [channels, kernel, 1]), the
gated norm is stored grouped [groups, d_inner / groups], Q and K rows are permuted as LlamaModel
permutes them, and `ssm_dt.bias` is mlx-lm's `dt_bias`. The Granite multipliers are the
`embedding_scale`, `attention.scale`, `residual_scale` and `logit_scale` keys;
`rope.scaling.finetuned` false (Granite 4.0 H) means no rope. llama.cpp does not clamp dt
(mlx-lm's default clamps it to [0.001, 100]), so the limit is opened. Tiny and Small add routed
experts (stacked [experts, out, in], gate and up apart: mlx-lm's SwitchGLU layout) and a shared
expert, whose gate and up the converter split and mlx-lm holds in one `input_linear` (joined
again here, gate first); llama.cpp routes by softmax, then renormalizes the top k, which is
mlx-lm's softmax over the top k logits.
"""

from __future__ import annotations

import re
from typing import Any

import mlx.core as mx
import numpy as np

from macspec.errors import MacspecError
from macspec.models.gguf.archs.base import LAYER_NAMES, Metadata
from macspec.models.gguf.archs.granite import granite_multipliers
from macspec.models.gguf.archs.llama import Llama
from macspec.models.gguf.header import GGUFHeader

MOE_NAMES = {
    "ffn_gate_inp": "block_sparse_moe.router.layer",
    "ffn_gate_exps": "block_sparse_moe.switch_mlp.gate_proj",
    "ffn_up_exps": "block_sparse_moe.switch_mlp.up_proj",
    "ffn_down_exps": "block_sparse_moe.switch_mlp.down_proj",
    "ffn_gate_shexp": "shared_mlp.input_linear",
    "ffn_up_shexp": "shared_mlp.input_linear",
    "ffn_gate_up_shexp": "shared_mlp.input_linear",  # the two above, joined by `fused`
    "ffn_down_shexp": "shared_mlp.output_linear",
}
SSM_NAMES = {
    "ssm_in": "mamba.in_proj",
    "ssm_conv1d": "mamba.conv1d",
    "ssm_norm": "mamba.norm",
    "ssm_out": "mamba.out_proj",
}
_SSM_VECTOR = re.compile(r"blk\.(\d+)\.(ssm_a|ssm_d|ssm_dt\.bias)")
"""Tensors with no `.weight` of their own (`ssm_dt.bias` is the mixer's `dt_bias`)."""
SSM_VECTORS = {"ssm_a": "mamba.A_log", "ssm_d": "mamba.D", "ssm_dt.bias": "mamba.dt_bias"}


class GraniteHybrid(Llama):
    name, model_type = "granitehybrid", "granitemoehybrid"
    layer_names = {**LAYER_NAMES, **SSM_NAMES, **MOE_NAMES}

    def extra_config(
        self, header: GGUFHeader, key: Metadata, config: dict[str, Any]
    ) -> dict[str, Any]:
        if int(key("ssm.group_count")) != 1:  # mlx-lm's gated norm is over d_inner whole
            raise MacspecError(f"{header.path}: a Mamba2 norm of several groups is not read yet")
        kv = np.asarray(key("attention.head_count_kv")).reshape(-1)  # 0: a Mamba layer
        kv_heads = np.broadcast_to(kv, (config["num_hidden_layers"],)).tolist()
        ssm_heads, inner = int(key("ssm.time_step_rank")), int(key("ssm.inner_size"))
        tensors = header.tensors
        return {
            "layer_types": ["attention" if n else "mamba" for n in kv_heads],
            **self._feed_forward(key, config),
            "attention_bias": any(name.endswith("attn_q.bias") for name in tensors),
            **granite_multipliers(key, config),
            "position_embedding_type": "rope" if key("rope.scaling.finetuned", True) else "nope",
            "mamba_n_heads": ssm_heads,
            "mamba_d_head": inner // ssm_heads,
            "mamba_n_groups": 1,
            "mamba_d_state": int(key("ssm.state_size")),
            "mamba_d_conv": int(key("ssm.conv_kernel")),
            "mamba_proj_bias": any(name.endswith("ssm_in.bias") for name in tensors),
            "mamba_conv_bias": any(name.endswith("ssm_conv1d.bias") for name in tensors),
            "time_step_limit": [0.0, float("inf")],
        }

    def _feed_forward(self, key: Metadata, config: dict[str, Any]) -> dict[str, Any]:
        """Routed experts and a shared one (Tiny, Small), or the shared MLP alone as the
        layer's FFN (Micro: `feed_forward_length` and the shared length are one)."""
        experts, shared = (
            int(key("expert_count", 0)),
            int(key("expert_shared_feed_forward_length", 0)),
        )
        if not experts:
            return {"intermediate_size": shared or config["intermediate_size"]}
        return {
            "num_local_experts": experts,
            "num_experts_per_tok": int(key("expert_used_count")),
            "shared_intermediate_size": shared,
        }

    def fused(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        joined = dict(weights)
        for name in weights:
            if ".ffn_gate_shexp." not in name:
                continue
            up = name.replace("_gate_", "_up_")
            gate_part, up_part = joined.pop(name), joined.pop(up)
            if gate_part.shape[1:] != up_part.shape[1:] or gate_part.dtype != up_part.dtype:
                raise MacspecError(
                    f"{name} and {up} are stored in different types; macspec holds them in one"
                )
            joined[name.replace("_gate_", "_gate_up_")] = mx.concatenate([gate_part, up_part])
        return joined

    def mlx_name(self, name: str) -> str:
        match = _SSM_VECTOR.fullmatch(name)
        if match:
            return f"model.layers.{match.group(1)}.{SSM_VECTORS[match.group(2)]}"
        return super().mlx_name(name)

    def undo(self, name: str, value: mx.array, config: dict[str, Any]) -> mx.array:
        part = _SSM_VECTOR.fullmatch(name)
        if part and part.group(2) == "ssm_a":
            return mx.log(-value.reshape(-1))  # A = -exp(A_log)
        if part:
            return value.reshape(-1)
        if name.endswith("ssm_conv1d.weight"):
            return value[..., None]
        if name.endswith("ssm_norm.weight"):
            return value.reshape(-1)
        return super().undo(name, value, config)
