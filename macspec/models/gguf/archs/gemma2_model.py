"""mlx-lm's gemma2 with the sliding window llama.cpp (and Hugging Face's Gemma 2) gives every
`sliding_window_pattern`-th layer but the last of each period: mlx-lm's attends globally on
every layer, the same only while a context is shorter than the window (4096 in Gemma 2). Its
attention, MLP and blocks are mlx-lm's own; only the masks and caches are per layer, as
mlx-lm's gemma3_text makes them (a RotatingKVCache of the window on a sliding layer)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx_lm.models import gemma2
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import KVCache, RotatingKVCache


@dataclass
class ModelArgs(gemma2.ModelArgs):
    sliding_window: int = 4096
    sliding_window_pattern: int = 2


def _is_global(layer: int, pattern: int) -> bool:
    return layer % pattern == pattern - 1


def _grouped(mask: mx.array | None, args: ModelArgs) -> mx.array | None:
    """A mask of one row per sequence, (B, 1, L, S) as `serve`'s batch makes it, with the axis
    mlx-lm's gemma2 groups queries on where heads share keys: (B, kv heads, repeats, L, S)."""
    if mask is None or mask.ndim != 4 or args.num_attention_heads == args.num_key_value_heads:
        return mask
    return mask[:, :, None]


class WindowedGemmaModel(gemma2.GemmaModel):
    def __call__(self, inputs: mx.array, cache: list[Any] | None = None) -> mx.array:
        args = self.args
        h = self.embed_tokens(inputs) * (args.hidden_size**0.5)
        if cache is None:
            cache = [None] * len(self.layers)
        pattern = args.sliding_window_pattern
        global_layer = min(pattern - 1, len(self.layers) - 1)
        # the global layers' mask from a global layer's cache, the local ones' from layer 0's
        full = create_attention_mask(h, cache[global_layer], return_array=True)
        local = create_attention_mask(
            h, cache[0], window_size=args.sliding_window, return_array=True
        )
        full, local = _grouped(full, args), _grouped(local, args)
        for i, (layer, layer_cache) in enumerate(zip(self.layers, cache, strict=True)):
            h = layer(h, full if _is_global(i, pattern) else local, layer_cache)
        return self.norm(h)


class Model(gemma2.Model):
    def __init__(self, args: ModelArgs):
        super().__init__(args)
        self.model = WindowedGemmaModel(args)

    def make_cache(self) -> list[Any]:
        pattern, window = self.args.sliding_window_pattern, self.args.sliding_window
        return [
            KVCache() if _is_global(i, pattern) else RotatingKVCache(max_size=window)
            for i in range(self.args.num_hidden_layers)
        ]


def model_classes(config: dict) -> tuple[type, type]:
    """macspec's windowed gemma2 for any config (the GGUF's are all gemma2)."""
    return Model, ModelArgs
