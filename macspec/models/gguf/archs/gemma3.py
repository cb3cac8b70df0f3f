"""gemma3 (Gemma 3 text; Ollama's files also carry the vision tower).

convert_hf_to_gguf.py's Gemma3Model stores every RMSNorm weight with 1 added (llama.cpp
multiplies by w; mlx-lm's Gemma adds the 1 itself, so it is taken off here). llama.cpp fixes
every 6th layer global and the local rope base at 10000 (no key says them).

Ollama's own converter (ollama/ollama convert/convert_gemma3.go) writes the multimodal
checkpoints with their vision tower in the same file: `gemma3.vision.*` and
`gemma3.mm.tokens_per_image` keys, tensors `v.*` and `mm.*` (left unread here), and without
the keys its engine defaults (model/models/gemma3/model_text.go, `newTextModel`, before
ollama 9db4bdbad moved GGML models to llama-server): key and value length 256, RMS epsilon
1e-6, rope bases 1e6 (global) and 1e4 (local), and a linear rope scale of 8 on the global
layers of the 4B, 12B and 27B models (34, 48, 62 blocks) when the window is shorter than the
context (for Ollama's multimodal files only: llama.cpp scales none without the key). The
converter writes the head counts from the block count (same file).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import mlx.core as mx
import numpy as np

from macspec.errors import MacspecError
from macspec.models.gguf.archs.base import LAYER_NAMES, Architecture, Metadata
from macspec.models.gguf.foreign import FOREIGN_PREFIXES
from macspec.models.gguf.header import GGUFHeader

SLIDING_PATTERN = 6
"""Every 6th Gemma 3 layer attends globally (llama.cpp fixes it too; no GGUF key says it)."""
LOCAL_ROPE_BASE = 10_000.0
GLOBAL_ROPE_BASE = 1_000_000.0
HEAD_DIM = 256
HEADS_BY_BLOCKS = {34: (8, 4), 48: (16, 8), 62: (32, 16)}
"""convert_gemma3.go: (query heads, key-value heads) of the 4B, 12B and 27B models."""
ROPE_SCALE_BY_BLOCKS = {34: 8.0, 48: 8.0, 62: 8.0}
"""model_text.go: the global layers' rope scale of the 4B, 12B and 27B models, a file without
one (and a window shorter than its context) given."""
BLOCKS_27B = 62
VISION_KEYS = ("vision.block_count", "mm.tokens_per_image")
VISION_PREFIXES = FOREIGN_PREFIXES["gemma3"]


class Gemma3(Architecture):
    name, model_type = "gemma3", "gemma3_text"
    layer_names = {
        **LAYER_NAMES,
        "ffn_norm": "pre_feedforward_layernorm",
        "post_attention_norm": "post_attention_layernorm",
        "post_ffw_norm": "post_feedforward_layernorm",
    }
    default_rope_base = GLOBAL_ROPE_BASE

    def config(self, header: GGUFHeader) -> dict[str, Any]:
        return super().config(_with_ollama_defaults(header))

    def extra_config(
        self, header: GGUFHeader, key: Metadata, config: dict[str, Any]
    ) -> dict[str, Any]:
        blocks, context = config["num_hidden_layers"], config["max_position_embeddings"]
        window = int(key("attention.sliding_window", 0))
        _check_softcap(header, key, blocks, window < context)
        extra: dict[str, Any] = {
            # llama.cpp: no window (converters omit it when every layer is global), no SWA
            "sliding_window": window or context,
            "sliding_window_pattern": sliding_pattern(header, key, blocks) if window else 1,
            "rope_local_base_freq": float(
                key("rope.freq_base_swa", key("rope.local.freq_base", LOCAL_ROPE_BASE))
            ),
            "query_pre_attn_scalar": query_pre_attn_scalar(config, BLOCKS_27B),
        }
        scale = key.get("rope.scaling.factor")
        if scale is None and has_vision(header) and window < context:
            scale = ROPE_SCALE_BY_BLOCKS.get(blocks)
        if scale is not None and float(scale) != 1.0:
            extra["rope_scaling"] = {"type": "linear", "factor": float(scale)}
        return extra

    def notices(self, header: GGUFHeader) -> list[str]:
        if not has_vision(header):
            return []
        return [
            f"{header.path.name} carries Gemma 3's vision tower: the text model runs, the image "
            "part is not used yet"
        ]

    def undo(self, name: str, value: mx.array, config: dict[str, Any]) -> mx.array:
        if name.endswith("norm.weight"):
            return value - 1  # the converter added Gemma's (1 + w) offset
        return value


def query_pre_attn_scalar(config: dict[str, Any], blocks_27b: int) -> int:
    """llama.cpp and Ollama: Gemma's 27B model (`blocks_27b` blocks) scales queries by
    1/sqrt(hidden / heads), the others by 1/sqrt(head size)."""
    if config["num_hidden_layers"] == blocks_27b:
        return config["hidden_size"] // config["num_attention_heads"]
    return config["head_dim"]


def has_vision(header: GGUFHeader) -> bool:
    """A file Ollama's converter wrote from a multimodal checkpoint."""
    return any(f"gemma3.{key}" in header.metadata for key in VISION_KEYS)


def _with_ollama_defaults(header: GGUFHeader) -> GGUFHeader:
    """The header with the keys Ollama's converter leaves to its engine filled in as it does."""
    meta = header.metadata
    blocks = meta.get("gemma3.block_count")
    heads, kv_heads = HEADS_BY_BLOCKS.get(blocks, (None, None)) if blocks else (None, None)
    defaults = {
        "gemma3.attention.key_length": HEAD_DIM,
        "gemma3.attention.value_length": HEAD_DIM,
        "gemma3.attention.head_count": heads,
        "gemma3.attention.head_count_kv": kv_heads,
    }
    missing = {k: v for k, v in defaults.items() if k not in meta and v is not None}
    return replace(header, metadata={**meta, **missing}) if missing else header


def _check_softcap(header: GGUFHeader, key: Metadata, blocks: int, windowed: bool) -> None:
    """One line for a final logit softcap, which llama.cpp applies and mlx-lm's gemma3_text
    does not; but Ollama's engine drops the 30.0 its older converter wrote for Gemma 3 1B
    (model_text.go: 26 blocks, a window shorter than the context), and so does this."""
    softcap = float(key("final_logit_softcapping", 0.0))
    if softcap > 0 and not (blocks == 26 and windowed):
        raise MacspecError(
            f"{header.path}: a final logit softcap ({softcap:g}) is not supported yet for gemma3"
        )


def sliding_pattern(
    header: GGUFHeader, key: Metadata, blocks: int, default: int = SLIDING_PATTERN
) -> int:
    """`attention.sliding_window_pattern` as mlx-lm's period: llama.cpp's `load_swa_pattern`
    reads a period or (Ollama's converter) one bool per layer, true where it is local;
    `default` (the architecture's own) without it."""
    local = key.get("attention.sliding_window_pattern")
    if local is None:
        return default
    if isinstance(local, int):
        if local <= 0:  # llama.cpp: every layer slides, which mlx-lm's period cannot say
            raise MacspecError(
                f"{header.path}: a sliding window on every layer (pattern {local}) is not "
                "supported yet"
            )
        return local
    local = np.asarray(local, dtype=bool)
    period = int(np.argmin(local)) + 1
    if (
        local.all()
        or len(local) != blocks
        or any(local[i] != ((i + 1) % period != 0) for i in range(blocks))
    ):
        raise MacspecError(
            f"{header.path}: a sliding-window pattern that is not one global layer every N "
            "is not supported yet"
        )
    return period
