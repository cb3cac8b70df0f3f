"""What to generate and when to stop: the engine's GenerationConfig."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from macspec.engine.core.grammar import Grammar
from macspec.engine.core.sampling import SamplingParams
from macspec.errors import MacspecError


@dataclass(frozen=True)
class GenerationConfig:
    """What to generate and when to stop."""

    max_tokens: int = 256
    """Most tokens to generate."""
    sampling: SamplingParams = SamplingParams()
    """Temperature and filters; the default is greedy."""
    stop_strings: tuple[str, ...] = ()
    """Text that ends the answer when it appears (it is not shown)."""
    seed: int | None = None
    """Seed for sampled runs; None draws a fresh one."""
    context_length: int | None = None
    """Tokens the model can attend to, prompt included; the answer stops there (finish
    reason 'context') and a prompt that fills it is refused. None: no limit."""
    prefill_step_size: int = 2048
    """Prompt ids per prefill pass (mlx-lm's --prefill-step-size)."""
    sampler: str | None = None
    """Sampled runs: 'coupled' (output identical to plain decoding with the seed, whatever
    drafts) or 'rejection' (the most guesses kept); None: coupled with a seed, else rejection."""
    grammar: Grammar | None = None
    """What the answer must match (a JSON schema, a regex, a Lark grammar): the target's
    distribution is masked to it at every position, guesses included. None: free text."""
    continuation: bool = False
    """The answer continues the prompt's own text (a raw completion, no chat template): its
    text keeps a leading space, so prompt + text reads as the model wrote it."""

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise MacspecError(f"--max-tokens must be >= 1, got {self.max_tokens}")
        if self.prefill_step_size < 1:
            raise MacspecError(f"--prefill-step-size must be >= 1, got {self.prefill_step_size}")

    def within_context(self, prompt_tokens: int) -> tuple[GenerationConfig, bool]:
        """This config for a prompt of `prompt_tokens`: max_tokens cut to the room the context
        window leaves, and whether the window (not max_tokens) bounds the answer. A prompt
        that fills the window is refused."""
        if self.context_length is None:
            return self, False
        room = self.context_length - prompt_tokens
        if room < 1:
            raise MacspecError(
                f"the prompt is {prompt_tokens} tokens and the model's context holds "
                f"{self.context_length}; shorten it"
            )
        if room < self.max_tokens:
            return replace(self, max_tokens=room), True
        return self, False  # max_tokens comes first


@dataclass(frozen=True)
class CacheOptions:
    """How a model's cache is made (mlx-lm's flags of the same names)."""

    kv_bits: int | None = None
    """Quantize attention keys and values to 4 or 8 bits (None: full precision)."""
    kv_group_size: int = 64
    """Group size of that quantization."""
    quantized_kv_start: int = 0
    """Quantize a layer's cache once it holds this many ids (mlx-lm's default is 5000)."""
    max_kv_size: int | None = None
    """Keep at most this many ids per layer: a sliding window (None: all of them)."""

    def __post_init__(self) -> None:
        if self.kv_bits is not None and self.kv_bits not in (4, 8):
            raise MacspecError(f"--kv-bits must be 4 or 8, got {self.kv_bits}")
        if self.kv_group_size not in (32, 64, 128):
            raise MacspecError(f"--kv-group-size must be 32, 64 or 128, got {self.kv_group_size}")
        if self.max_kv_size is not None and self.max_kv_size < 1:
            raise MacspecError(f"--max-kv-size must be positive, got {self.max_kv_size}")
        if self.quantized_kv_start < 0:
            raise MacspecError("--quantized-kv-start must not be negative")

    def make(self, model: Any) -> list[Any]:
        from mlx_lm.models.cache import make_prompt_cache  # mlx-lm loads only when caches do

        model_type = getattr(model, "model_type", None)
        if self.kv_bits is not None and model_type in KEYS_READ_DIRECTLY:
            raise MacspecError(
                f"--kv-bits: {model_type}'s attention (mlx-lm's) multiplies its keys directly, "
                "so its cache cannot be quantized; run it without --kv-bits"
            )
        return make_prompt_cache(model, max_kv_size=self.max_kv_size)

    def quantize(self, cache: list[Any]) -> None:
        """Turn full attention caches that hold enough ids into quantized ones, as mlx-lm's
        generate does after every pass (sliding windows stay as they are: mlx-lm cannot
        quantize them)."""
        if self.kv_bits is None:
            return
        from mlx_lm.models.cache import KVCache

        for i, layer_cache in enumerate(cache):
            if type(layer_cache) is KVCache and layer_cache.offset >= self.quantized_kv_start:
                cache[i] = layer_cache.to_quantized(
                    group_size=self.kv_group_size, bits=self.kv_bits
                )


KEYS_READ_DIRECTLY = frozenset({"gemma2", "olmo"})
"""mlx-lm models whose attention multiplies the cached keys itself instead of calling
`scaled_dot_product_attention`, which is what reads a quantized cache."""

DEFAULT_CACHE = CacheOptions()
"""Full-precision caches that keep every id."""
