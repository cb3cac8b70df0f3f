"""phi3 (Phi-3, Phi-3.5-mini, Phi-4, Phi-4-mini) as mlx-lm's `phi3`.

convert_hf_to_gguf.py's Phi3MiniModel (conversion/phi.py) keeps the checkpoint's fused
projections (`qkv_proj` as `attn_qkv`, `gate_up_proj` as `ffn_up`: mlx-lm's own layout, gate
first), writes the rotated dimensions (`rope.dimension_count`: Phi-4-mini rotates 3/4 of each
head) and, for LongRoPE checkpoints, the long and short factors as the tensors
`rope_factors_long` and `rope_factors_short` (read back into config.json's `rope_scaling`).
Its `sliding_window` key is ignored, as llama.cpp's phi3 graph ignores it (src/models/phi3.cpp).

LongRoPE: llama.cpp picks one set of factors when its context is made, by the context's size
(llama_model::get_rope_factors: the long ones only when n_ctx exceeds `rope.scaling.original_
context_length`), and scales the rotated dimensions by `rope.scaling.attn_factor` with either.
macspec rotates by the short ones, as llama.cpp does at the contexts Ollama and LM Studio start
it with (4096, Phi-3.5-mini's and Phi-4-mini's original context) and as Hugging Face does within
the original length; mlx-lm's SuScaledRoPE rotates by the set it is given as `long_factor` (at
every length) with the same attention factor, so the short set is handed to it under that name.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gguf import GGMLQuantizationType

from macspec.errors import MacspecError
from macspec.models.gguf.archs.base import LAYER_NAMES, Architecture, Metadata
from macspec.models.gguf.header import GGUFHeader

FACTORS = {"long_factor": "rope_factors_long.weight", "short_factor": "rope_factors_short.weight"}


class Phi3(Architecture):
    name, model_type = "phi3", "phi3"
    layer_names = {**LAYER_NAMES, "attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"}

    def extra_config(
        self, header: GGUFHeader, key: Metadata, config: dict[str, Any]
    ) -> dict[str, Any]:
        head_dim = config["hidden_size"] // config["num_attention_heads"]
        extra: dict[str, Any] = {
            "partial_rotary_factor": int(key("rope.dimension_count", head_dim)) / head_dim,
            "original_max_position_embeddings": int(
                key("rope.scaling.original_context_length", config["max_position_embeddings"])
            ),
        }
        if FACTORS["long_factor"] in header.tensors:
            short = _values(header, FACTORS["short_factor"]).tolist()
            extra["rope_scaling"] = {
                "type": "longrope",
                "short_factor": short,
                "long_factor": short,  # the set SuScaledRoPE rotates by (module docstring)
            }
        return extra

    def is_config(self, name: str) -> bool:
        return name in FACTORS.values()


def _values(header: GGUFHeader, name: str) -> np.ndarray:
    """A small F32 tensor's values, read from the file (configuration, not a weight)."""
    entry = header.tensors.get(name)
    if entry is None or entry.qtype != GGMLQuantizationType.F32:
        raise MacspecError(f"{header.path}: {name} missing or not F32")
    count = int(np.prod(entry.shape))
    return np.fromfile(entry.file, "<f4", count, offset=entry.start)
