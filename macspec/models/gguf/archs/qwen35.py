"""qwen35 (Qwen3.5 and Qwen3.6 dense: Gated DeltaNet layers between full attention layers) as
mlx-lm's `qwen3_5`.

convert_hf_to_gguf.py's Qwen3_5TextModel (conversion/qwen.py, by way of Qwen3NextModel and
_LinearAttentionVReorderBase) changes, and this module undoes:
- the value heads of each linear layer from grouped by key head ([K0v0, K0v1, K1v0, K1v1]) to
  tiled ([K0v0, K1v0, K0v1, K1v1]) for ggml's broadcast: the V rows of `attn_qkv` and of the
  conv1d kernel, the rows of `attn_gate` (z), `ssm_alpha`, `ssm_beta`, `ssm_a`, `ssm_dt`, and
  the columns of `ssm_out`;
- `A_log` stored as `ssm_a` = -exp(A_log); `dt_bias` named `ssm_dt.bias`;
- the conv1d kernel squeezed from [channels, 1, kernel] to [channels, kernel];
- +1 on every RMSNorm but the gated one (`ssm_norm`): Qwen3.5 checkpoints store w of (1 + w),
  mlx-lm's class wants 1 + w, and its sanitize adds it only to unconverted conv1d checkpoints.
The full attention's `attn_q` keeps query and output gate per head, as mlx-lm reads it.

The MTP layers (`nextn_predict_layers`) come after the decoder's as extra blocks; llama.cpp's
main pass does not run them, nor does the target here: they become its MTP drafter (mtp.py).
The rope is interleaved MRoPE; on text every section has the same position, so it is mlx-lm's
partial rope.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from macspec.errors import MacspecError
from macspec.models.gguf.archs.base import (
    EXPERT_NAMES,
    LAYER_NAMES,
    Architecture,
    Metadata,
    routed_experts,
)
from macspec.models.gguf.header import GGUFHeader

LINEAR_NAMES = {
    "attn_qkv": "linear_attn.in_proj_qkv",
    "attn_gate": "linear_attn.in_proj_z",
    "ssm_alpha": "linear_attn.in_proj_a",
    "ssm_beta": "linear_attn.in_proj_b",
    "ssm_out": "linear_attn.out_proj",
    "ssm_norm": "linear_attn.norm",
    "ssm_conv1d": "linear_attn.conv1d",
}
QWEN35_NAMES = {**LAYER_NAMES, **LINEAR_NAMES, "post_attention_norm": "post_attention_layernorm"}
PREFIX = "language_model."
"""mlx-lm's qwen3_5 wraps the text model (a vision model's place beside it)."""
PARAMETERS = {"ssm_a": "linear_attn.A_log", "ssm_dt.bias": "linear_attn.dt_bias"}
"""Arrays of the module, not a sub-module's weight: their GGUF names have no `.weight`."""
SHARED_EXPERT_NAMES = {
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj",
    "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
    "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
}
TILED_ROWS = ("attn_gate", "ssm_alpha", "ssm_beta", "ssm_a", "ssm_dt")


class Qwen35(Architecture):
    name, model_type = "qwen35", "qwen3_5"
    layer_names = QWEN35_NAMES

    def extra_config(
        self, header: GGUFHeader, key: Metadata, config: dict[str, Any]
    ) -> dict[str, Any]:
        layers = config["num_hidden_layers"] - int(key("nextn_predict_layers", 0))
        v_heads, inner = int(key("ssm.time_step_rank")), int(key("ssm.inner_size"))
        interval = int(key("full_attention_interval", 4))
        _check_layer_types(header, key, layers, interval)
        # the sections of its interleaved MRoPE need no entry: on text all have one position
        rope = {
            "type": "default",
            "rope_theta": config["rope_theta"],
            "partial_rotary_factor": int(key("rope.dimension_count")) / config["head_dim"],
        }
        return {
            "num_hidden_layers": layers,
            "linear_conv_kernel_dim": int(key("ssm.conv_kernel")),
            "linear_key_head_dim": int(key("ssm.state_size")),
            "linear_num_key_heads": int(key("ssm.group_count")),
            "linear_num_value_heads": v_heads,
            "linear_value_head_dim": inner // v_heads,
            "full_attention_interval": interval,
            "rope_parameters": rope,
        }

    def mlx_name(self, name: str) -> str:
        block, _, part = name.partition(".")[2].partition(".")
        if name.startswith("blk.") and part in PARAMETERS:
            return f"{PREFIX}model.layers.{block}.{PARAMETERS[part]}"
        return PREFIX + super().mlx_name(name)

    def is_unused(self, name: str, header: GGUFHeader) -> bool:
        if not name.startswith("blk."):
            return False
        key = Metadata(header)
        layers = int(key("block_count")) - int(key("nextn_predict_layers", 0))
        return int(name.split(".")[1]) >= layers

    def undo(self, name: str, value: mx.array, config: dict[str, Any]) -> mx.array:
        part = name.split(".")[2] if name.startswith("blk.") else ""
        k_heads, v_heads = config["linear_num_key_heads"], config["linear_num_value_heads"]
        if part == "ssm_a":
            value = mx.log(-value)
        key_rows = 2 * k_heads * config["linear_key_head_dim"]
        if part in TILED_ROWS:
            value = _grouped(value, 0, k_heads, v_heads)
        elif part in ("attn_qkv", "ssm_conv1d"):
            value = mx.concatenate(
                [value[:key_rows], _grouped(value[key_rows:], 0, k_heads, v_heads)]
            )
        elif part == "ssm_out":  # columns; quantized, whole groups of each head's columns
            value = _grouped(value, value.ndim - 1, k_heads, v_heads)
        if part == "ssm_conv1d" and name.endswith(".weight"):
            value = value[..., None]  # [channels, kernel] -> mlx's Conv1d [out, kernel, in/groups]
        return value


def _grouped(value: mx.array, axis: int, k_heads: int, v_heads: int) -> mx.array:
    """The value heads along `axis` from llama.cpp's tiled order back to grouped by key head."""
    if k_heads == v_heads:
        return value
    size = value.shape[axis]
    if size % v_heads:
        raise MacspecError(f"a qwen35 tensor of {size} along its heads' axis for {v_heads} heads")
    moved = mx.moveaxis(value, axis, 0)
    rest = moved.shape[1:]
    heads = moved.reshape(v_heads // k_heads, k_heads, size // v_heads, *rest)
    grouped = mx.swapaxes(heads, 0, 1).reshape(size, *rest)
    return mx.moveaxis(grouped, 0, axis)


def _check_layer_types(header: GGUFHeader, key: Metadata, layers: int, interval: int) -> None:
    """mlx-lm places full attention every `interval` layers: one line where the file's own
    per-layer flags (`attention.recurrent_layers`) say otherwise."""
    flags = key.get("attention.recurrent_layers")
    if flags is None:
        return
    expected = [(i + 1) % interval != 0 for i in range(layers)]
    if [bool(flag) for flag in list(flags)[:layers]] != expected:
        raise MacspecError(
            f"{header.path}: its linear and full attention layers are not one full layer "
            f"every {interval}, which is all mlx-lm's qwen3_5 builds"
        )


class Qwen35Moe(Qwen35):
    """qwen35moe (Qwen3.5-35B-A3B, Qwen3.6 MoE) as mlx-lm's `qwen3_5_moe`: qwen35's layers with
    a sparse MLP. Qwen2MoeModel (the converter's base) splits the checkpoint's fused
    `experts.gate_up_proj` (gate first) and stores each projection's experts as [experts, out,
    in], mlx-lm's SwitchGLU layout; the shared expert and its sigmoid gate are `*_shexp`.
    llama.cpp's graph (src/models/qwen35moe.cpp) routes by softmax, renormalizes the top-k
    weights, and makes every layer sparse."""

    name, model_type = "qwen35moe", "qwen3_5_moe"
    layer_names = {**QWEN35_NAMES, **EXPERT_NAMES, **SHARED_EXPERT_NAMES}

    def feed_forward_length(self, key: Metadata) -> int:
        return int(key("feed_forward_length", 0))

    def extra_config(
        self, header: GGUFHeader, key: Metadata, config: dict[str, Any]
    ) -> dict[str, Any]:
        return {
            **super().extra_config(header, key, config),
            **routed_experts(key),
            "shared_expert_intermediate_size": int(key("expert_shared_feed_forward_length")),
        }

    def undo(self, name: str, value: mx.array, config: dict[str, Any]) -> mx.array:
        if ".ffn_gate_inp_shexp." in name and value.ndim == 1:  # one gate value per token
            return value[None]
        return super().undo(name, value, config)
