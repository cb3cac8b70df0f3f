"""llama (Llama 2/3, SmolLM2, Mistral's llama files): convert_hf_to_gguf.py's LlamaModel permutes
the Q and K rows of each head for interleaved rope (put back here, so mlx-lm's usual rope reads
them); Llama 3.1's rope scaling is a `rope_freqs` tensor of per-frequency factors (set on the
rope after the model is built)."""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import mlx.core as mx
import numpy as np

from macspec.models.gguf.archs.base import Architecture, Metadata
from macspec.models.gguf.header import GGUFHeader

ROPE_FREQS = "rope_freqs.weight"
"""Configuration stored as a tensor (Llama 3.1's rope factors), not a weight."""


@lru_cache(maxsize=8)
def _unpermute_rows(rows: int, heads: int) -> mx.array:
    """The row order that undoes llama.cpp's `permute` of a Q or K projection."""
    order = np.arange(rows).reshape(heads, 2, rows // heads // 2).swapaxes(1, 2).reshape(-1)
    return mx.array(np.argsort(order))


class Llama(Architecture):
    name, model_type = "llama", "llama"

    def extra_config(
        self, header: GGUFHeader, key: Metadata, config: dict[str, Any]
    ) -> dict[str, Any]:
        extra: dict[str, Any] = {"attention_bias": "blk.0.attn_q.bias" in header.tensors}
        if ROPE_FREQS in header.tensors:
            # Llama 3.1: a Llama3RoPE whose frequencies are then set from the file's factors.
            # (The values are transformers' defaults: it checks them when reading the config.)
            extra["rope_scaling"] = {
                "rope_type": "llama3",
                "factor": float(key("rope.scaling.factor", 8.0)),
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": int(
                    key("rope.scaling.original_context_length", 8192)
                ),
            }
        return extra

    def is_config(self, name: str) -> bool:
        return name == ROPE_FREQS

    def undo(self, name: str, value: mx.array, config: dict[str, Any]) -> mx.array:
        part = name.split(".")[2] if name.startswith("blk.") else ""
        heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
        if part not in heads:
            return value
        return mx.take(value, _unpermute_rows(value.shape[0], heads[part]), axis=0)

    def rope_factors(self, weights: Mapping[str, mx.array]) -> mx.array | None:
        return weights.get(ROPE_FREQS)


class Mistral3(Llama):
    """Mistral Small 3.1/3.2 and Devstral: convert_hf_to_gguf.py's Mistral3Model writes the text
    model as a LlamaModel under this name (Q and K rows permuted the same way), and llama.cpp
    reads it as llama (tests/fixtures/llamacpp/mistral3.json: the llama file's answer)."""

    name = "mistral3"
