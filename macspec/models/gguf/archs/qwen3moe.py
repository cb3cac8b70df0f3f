"""qwen3moe (Qwen3-30B-A3B, Qwen3-Coder-30B-A3B) as mlx-lm's `qwen3_moe`.

convert_hf_to_gguf.py's Qwen3MoeModel (conversion/qwen.py, from Qwen2MoeModel) stacks each
layer's experts into one [experts, out, in] tensor per projection (`ffn_{gate,up,down}_exps`:
the layout of mlx-lm's SwitchGLU, so nothing to undo) and names the router `ffn_gate_inp`; it
writes `expert_count`, `expert_used_count` and `expert_feed_forward_length`, not
`norm_topk_prob`: llama.cpp's qwen3moe graph (src/models/qwen3moe.cpp) renormalizes the top-k
weights always, routes by softmax, and makes every layer sparse.
"""

from __future__ import annotations

from typing import Any

from macspec.models.gguf.archs.base import (
    EXPERT_NAMES,
    LAYER_NAMES,
    Architecture,
    Metadata,
    routed_experts,
)
from macspec.models.gguf.header import GGUFHeader


class Qwen3Moe(Architecture):
    name, model_type = "qwen3moe", "qwen3_moe"
    layer_names = {**LAYER_NAMES, **EXPERT_NAMES}

    def extra_config(
        self, header: GGUFHeader, key: Metadata, config: dict[str, Any]
    ) -> dict[str, Any]:
        return {**routed_experts(key), "mlp_only_layers": []}
