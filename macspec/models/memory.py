"""Memory: how much a model pair needs (weights + KV cache) and how much this machine has."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

USABLE_FRACTION = 0.75
"""Share of total memory a model may take: macOS lets the GPU wire about 3/4 of unified memory
by default, and the OS and other apps need the rest elsewhere too."""
KV_BYTES_PER_VALUE = 2
"""float16/bfloat16 keys and values."""


def machine_memory_bytes() -> int | None:
    """Total memory of this machine: unified memory on a Mac, RAM elsewhere; None if unknown."""
    if sys.platform == "darwin":
        try:
            out = subprocess.run(
                ["sysctl", "-n", "hw.memsize"],
                capture_output=True,
                text=True,
                timeout=5,
                check=True,
            ).stdout
            return int(out.strip())
        except (OSError, subprocess.SubprocessError, ValueError):
            return None
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def usable_memory_bytes() -> int | None:
    """The part of this machine's memory a pair may use: on a Mac, the GPU's recommended working
    set (what generation wires, as mlx-lm sets it); elsewhere USABLE_FRACTION of the total."""
    if sys.platform == "darwin":
        try:
            import mlx.core as mx  # only on a Mac, and only here: `macspec models` stays light

            recommended = mx.device_info().get("max_recommended_working_set_size")
            if recommended:
                return int(recommended)
        except (ImportError, RuntimeError, AttributeError):
            pass
    total = machine_memory_bytes()
    return int(total * USABLE_FRACTION) if total else None


def attention_tokens(cfg: dict, context_length: int) -> int | None:
    """Ids all attention layers together hold at a full context: a full-attention layer holds
    the context, a sliding-window layer its window, a recurrent layer (Gated DeltaNet, Mamba, a
    short convolution) none. None when the config does not say enough."""
    layers = int(cfg["num_hidden_layers"])
    window = cfg.get("sliding_window") or context_length
    windowed = min(int(window), context_length)
    types = cfg.get("layer_types")
    if isinstance(types, list) and types:
        full = sum(t in ("full_attention", "attention") for t in types)
        sliding = sum(t == "sliding_attention" for t in types)
        return full * context_length + sliding * windowed
    if cfg.get("full_attention_interval"):  # Qwen3.5/3.6, Qwen3-Next: 1 in N is attention
        return layers // int(cfg["full_attention_interval"]) * context_length
    if str(cfg.get("model_type", "")).startswith("mamba"):
        return 0
    pattern = cfg.get("sliding_window_pattern")
    if cfg.get("sliding_window") and pattern:  # Gemma 3: 1 global layer in `pattern`
        full = layers // int(pattern)
        return full * context_length + (layers - full) * windowed
    return layers * context_length


DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
"""Bytes of a value in the dtype a config names (`torch_dtype`, or transformers' newer `dtype`):
the model computes in it, so its KV cache holds it."""


def kv_bytes_per_value(config: dict) -> int:
    """What one K or V value takes: the dtype the model computes in when its config says
    (a float32 model, a GGUF read with float32 scales), else 2 (float16, bfloat16)."""
    dtype = config.get("torch_dtype") or config.get("dtype")
    return DTYPE_BYTES.get(str(dtype), KV_BYTES_PER_VALUE)


def kv_cache_bytes(config: dict, context_length: int) -> int | None:
    """KV cache for a full context: 2 (K and V) * kv_heads * head_dim * the bytes of a value
    (`kv_bytes_per_value`) per id each attention layer holds (see attention_tokens: sliding
    windows and recurrent layers hold less).

    Reads an mlx-lm/transformers `config.json` (or its `text_config`, or a speculators head's
    `transformer_layer_config`); None if it lacks the sizes.
    """
    nested = config.get("text_config") or config.get("transformer_layer_config")
    cfg = nested if isinstance(nested, dict) else config
    try:
        heads = int(cfg["num_attention_heads"])
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
        tokens = attention_tokens(cfg, context_length)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    value = kv_bytes_per_value(config if "torch_dtype" in config or "dtype" in config else cfg)
    return None if tokens is None else 2 * kv_heads * head_dim * tokens * value


def weight_bytes(model_dir: Path) -> int:
    """Bytes of a model's safetensors weights (about what they take in memory)."""
    return sum(p.resolve().stat().st_size for p in model_dir.glob("*.safetensors") if p.exists())


@dataclass(frozen=True)
class MemoryEstimate:
    """What a pair needs in memory, next to what this machine can give it."""

    weights_bytes: int
    """Target plus draft weights (from the files on disk, else the catalog's size)."""
    kv_cache_bytes: int | None
    """Target plus draft KV caches at the pair's context length; None when a config is unknown."""
    available_bytes: int | None
    """The memory a pair may use here (USABLE_FRACTION of the total); None if unknown."""
    estimated: bool = False
    """True when a KV size comes from the catalog's published facts, not a downloaded config."""
    ranks: int = 1
    """Machines the target is sharded over (a pair's `ranks`); 1: one machine."""
    replicated_bytes: int = 0
    """Of the total, what every rank holds whole: the drafters' weights (when on disk) and KV
    caches. The rest, the target's weights and KV cache, is split over the ranks."""

    @property
    def total_bytes(self) -> int:
        """Weights plus the KV caches that are known."""
        return self.weights_bytes + (self.kv_cache_bytes or 0)

    @property
    def per_rank_bytes(self) -> int:
        """What one machine holds: the target's weights and KV cache over the ranks (tensor
        parallelism splits every layer's weights and KV heads; pipeline stages split the
        layers), plus the drafters whole. The total on one machine."""
        shared = self.total_bytes - self.replicated_bytes
        return -(-shared // self.ranks) + self.replicated_bytes

    @property
    def fits(self) -> bool | None:
        """Whether the pair fits this machine (its share, for a target over several ranks);
        None when this machine's memory is unknown, or when the weights fit but the KV cache
        size is not known yet."""
        if self.available_bytes is None:
            return None
        if self.per_rank_bytes > self.available_bytes:
            return False
        return None if self.kv_cache_bytes is None else True


def estimate(
    weights: int,
    configs: list[dict | None],
    context_length: int,
    estimated: bool = False,
    ranks: int = 1,
    drafter_weights: int = 0,
) -> MemoryEstimate:
    """Combine weight bytes and each model's config (None when unknown; the target's first)
    into an estimate; `estimated` marks configs taken from the catalog's facts rather than the
    model's files. Over several `ranks`, the drafters (`drafter_weights` and the KV caches of
    every config after the first) are on every rank whole."""
    kv_parts = [kv_cache_bytes(c, context_length) if c is not None else None for c in configs]
    kv = None if any(part is None for part in kv_parts) else sum(kv_parts)  # type: ignore[arg-type]
    replicated = drafter_weights + sum(part or 0 for part in kv_parts[1:]) if ranks > 1 else 0
    return MemoryEstimate(weights, kv, usable_memory_bytes(), estimated, ranks, replicated)
