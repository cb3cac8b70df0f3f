"""gemma3 (Gemma 3 text): convert_hf_to_gguf.py's Gemma3Model stores every RMSNorm weight with
1 added (llama.cpp multiplies by w; mlx-lm's Gemma adds the 1 itself, so it is taken off here).
llama.cpp fixes every 6th layer global and the local rope base at 10000 (no key says them)."""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from macspec.models.gguf.archs.base import LAYER_NAMES, Architecture, Metadata
from macspec.models.gguf.header import GGUFHeader

SLIDING_PATTERN = 6
"""Every 6th Gemma 3 layer attends globally (llama.cpp fixes it too; no GGUF key says it)."""
LOCAL_ROPE_BASE = 10_000.0


class Gemma3(Architecture):
    name, model_type = "gemma3", "gemma3_text"
    layer_names = {
        **LAYER_NAMES,
        "ffn_norm": "pre_feedforward_layernorm",
        "post_attention_norm": "post_attention_layernorm",
        "post_ffw_norm": "post_feedforward_layernorm",
    }

    def extra_config(
        self, header: GGUFHeader, key: Metadata, config: dict[str, Any]
    ) -> dict[str, Any]:
        hidden, heads = config["hidden_size"], config["num_attention_heads"]
        big = config["num_hidden_layers"] == 62
        return {
            "sliding_window": int(key("attention.sliding_window", 512)),
            "sliding_window_pattern": SLIDING_PATTERN,
            "rope_local_base_freq": LOCAL_ROPE_BASE,
            # llama.cpp: Gemma 3 27B scales queries by hidden/heads, the others by the head size.
            "query_pre_attn_scalar": hidden // heads if big else config["head_dim"],
        }

    def undo(self, name: str, value: mx.array, config: dict[str, Any]) -> mx.array:
        if name.endswith("norm.weight"):
            return value - 1  # the converter added Gemma's (1 + w) offset
        return value
