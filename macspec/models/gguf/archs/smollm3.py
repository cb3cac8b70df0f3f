"""smollm3 (SmolLM3-3B) as mlx-lm's `smollm3`: convert_hf_to_gguf.py's SmolLM3Model is its
LlamaModel (Q and K rows permuted, put back by `Llama`), and no key says which layers skip rope:
llama.cpp fixes every 4th layer as a NoPE layer (`n_no_rope_layer_step = 4` in
src/models/smollm3.cpp; the checkpoint's `no_rope_layers` list is not written), which is
mlx-lm's `no_rope_layer_interval`."""

from __future__ import annotations

from typing import Any

from macspec.errors import MacspecError
from macspec.models.gguf.archs.base import Metadata
from macspec.models.gguf.archs.llama import Llama
from macspec.models.gguf.header import GGUFHeader

NO_ROPE_LAYER_STEP = 4
"""llama.cpp's: layer i skips rope when (i + 1) % 4 == 0."""


class SmolLM3(Llama):
    name, model_type = "smollm3", "smollm3"

    def extra_config(
        self, header: GGUFHeader, key: Metadata, config: dict[str, Any]
    ) -> dict[str, Any]:
        if "rope_freqs.weight" in header.tensors:  # llama.cpp's smollm3 reads none either
            raise MacspecError(f"{header.path}: a smollm3 file with rope_freqs is not supported")
        return {
            **super().extra_config(header, key, config),
            "no_rope_layer_interval": NO_ROPE_LAYER_STEP,
        }
