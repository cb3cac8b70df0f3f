"""gemma2 (Gemma 2 2B, 9B, 27B) as mlx-lm's `gemma2`, with llama.cpp's sliding window.

convert_hf_to_gguf.py's Gemma2Model (conversion/gemma.py) stores every RMSNorm weight with 1
added (taken off here: mlx-lm's Gemma adds it itself), writes the attention and final logit
softcaps and the window, and no rope base (llama.cpp's default 10000) nor query scale.
llama.cpp (src/models/gemma2.cpp) slides every other layer, the first included
(`load_swa_pattern(ml, 2)`), over a window of 4096 without the key, and scales queries by
1/sqrt(head size), Gemma 2 27B's (46 blocks) by 1/sqrt(hidden / heads). mlx-lm's gemma2 attends
globally on every layer, so macspec's class (gemma2_model.py) adds the window.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mlx.core as mx

from macspec.errors import MacspecError
from macspec.models.gguf.archs.base import Architecture, Metadata
from macspec.models.gguf.archs.gemma3 import Gemma3, query_pre_attn_scalar, sliding_pattern
from macspec.models.gguf.header import GGUFHeader

SLIDING_PATTERN = 2
"""llama.cpp's gemma2: layers 0, 2, 4, ... slide, 1, 3, 5, ... attend globally."""
WINDOW = 4096
"""llama.cpp's window without `attention.sliding_window` (Gemma 2's)."""
ATTENTION_SOFTCAP, FINAL_SOFTCAP = 50.0, 30.0
"""llama.cpp's softcaps without their keys (llama-hparams.h)."""
BLOCKS_27B = 46


class Gemma2(Architecture):
    name, model_type = "gemma2", "gemma2"
    layer_names = Gemma3.layer_names

    def extra_config(
        self, header: GGUFHeader, key: Metadata, config: dict[str, Any]
    ) -> dict[str, Any]:
        local_base = key.get("rope.freq_base_swa")
        if local_base is not None and float(local_base) != config["rope_theta"]:
            raise MacspecError(
                f"{header.path}: a gemma2 local rope base ({local_base:g}) apart from the global "
                "one is not supported yet"
            )
        if "rope_scaling" in config:  # mlx-lm's gemma2 has no rope scaling to take it
            raise MacspecError(
                f"{header.path}: a gemma2 file with rope scaling is not supported yet"
            )
        if not config["tie_word_embeddings"]:  # llama.cpp's gemma2 refuses one too
            raise MacspecError(
                f"{header.path}: a gemma2 file with its own output.weight is not supported "
                "(Gemma 2 ties the output to the embedding)"
            )
        return {
            "sliding_window": int(key("attention.sliding_window", WINDOW)),
            "sliding_window_pattern": sliding_pattern(
                header, key, config["num_hidden_layers"], SLIDING_PATTERN
            ),
            "attn_logit_softcapping": float(key("attn_logit_softcapping", ATTENTION_SOFTCAP)),
            "final_logit_softcapping": float(key("final_logit_softcapping", FINAL_SOFTCAP)),
            "query_pre_attn_scalar": query_pre_attn_scalar(config, BLOCKS_27B),
        }

    def undo(self, name: str, value: mx.array, config: dict[str, Any]) -> mx.array:
        if name.endswith("norm.weight"):
            return value - 1  # the converter added Gemma's (1 + w) offset
        return value

    def model_classes(self) -> Callable[[dict], tuple[type, type]]:
        from macspec.models.gguf.archs.gemma2_model import model_classes

        return model_classes
