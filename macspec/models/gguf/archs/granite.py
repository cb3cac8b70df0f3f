"""granite (IBM Granite 3.x, dense) as mlx-lm's `granite`: convert_hf_to_gguf.py's GraniteModel
is its LlamaModel (Q and K rows permuted, put back by `Llama`; the checkpoint's `head_dim`
dropped) with the Granite multipliers written as the `embedding_scale`, `attention.scale`,
`residual_scale` and `logit_scale` keys (granitehybrid reads them the same way). llama.cpp
reads `rope.scaling.finetuned` false as no rope at all, which mlx-lm's granite cannot do."""

from __future__ import annotations

from typing import Any

from macspec.errors import MacspecError
from macspec.models.gguf.archs.base import Metadata
from macspec.models.gguf.archs.llama import Llama
from macspec.models.gguf.header import GGUFHeader


def granite_multipliers(key: Metadata, config: dict[str, Any]) -> dict[str, float]:
    """mlx-lm's multipliers from the file's keys; one left out (0 or absent, as llama.cpp
    reads it) changes nothing: 1, and 1/sqrt(head_dim) for attention."""
    return {
        "embedding_multiplier": float(key("embedding_scale", 0.0)) or 1.0,
        "attention_multiplier": float(key("attention.scale", 0.0)) or config["head_dim"] ** -0.5,
        "residual_multiplier": float(key("residual_scale", 0.0)) or 1.0,
        "logits_scaling": float(key("logit_scale", 0.0)) or 1.0,
    }


class Granite(Llama):
    name, model_type = "granite", "granite"

    def extra_config(
        self, header: GGUFHeader, key: Metadata, config: dict[str, Any]
    ) -> dict[str, Any]:
        if not key("rope.scaling.finetuned", True):
            raise MacspecError(f"{header.path}: a granite file without rope is not read yet")
        return {
            **super().extra_config(header, key, config),
            "mlp_bias": "blk.0.ffn_gate.bias" in header.tensors,
            **granite_multipliers(key, config),
        }
