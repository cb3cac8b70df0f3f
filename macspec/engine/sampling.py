"""Sampling settings -> probability vectors. Pure functions over MLX arrays.

The verifier needs the *distributions* p (target) and q (draft), not just samples, so both
models go through exactly the same processing here; greedy decoding never builds them.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

from macspec.errors import MacspecError


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen from the model's logits."""

    temperature: float = 0.0
    """Softmax temperature; 0 means greedy (argmax) decoding."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose mass reaches top_p (1 = off)."""
    top_k: int = 0
    """Keep only the k most likely tokens (0 = off)."""
    min_p: float = 0.0
    """Drop tokens less likely than min_p times the most likely one (0 = off)."""

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise MacspecError(f"--temp must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise MacspecError(f"--top-p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise MacspecError(f"--top-k must be >= 0, got {self.top_k}")
        if not 0 <= self.min_p < 1:
            raise MacspecError(f"--min-p must be in [0, 1), got {self.min_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def probabilities(logits: mx.array, params: SamplingParams) -> mx.array:
    """Rows of logits (..., V) -> rows of probabilities after temperature, top-k, min-p, top-p.

    Filters keep ties at their threshold, so the result depends only on the logits' values:
    the target and the draft get the same treatment of equal inputs.
    """
    if params.greedy:
        raise ValueError("greedy decoding has no distribution; use argmax")
    logits = logits.astype(mx.float32) / params.temperature
    neg_inf = mx.array(-mx.inf, mx.float32)
    vocab = logits.shape[-1]
    if 0 < params.top_k < vocab:
        kth_largest = mx.sort(logits, axis=-1)[..., vocab - params.top_k][..., None]
        logits = mx.where(logits < kth_largest, neg_inf, logits)
    probs = mx.softmax(logits, axis=-1)
    if params.min_p > 0:
        floor = params.min_p * probs.max(axis=-1, keepdims=True)
        probs = mx.where(probs < floor, 0.0, probs)
    if params.top_p < 1:
        sorted_probs = mx.sort(probs, axis=-1)[..., ::-1]
        mass_before = mx.cumsum(sorted_probs, axis=-1) - sorted_probs
        kept = mass_before < params.top_p * sorted_probs.sum(axis=-1, keepdims=True)
        # The smallest probability still kept; everything at least that likely stays.
        threshold = mx.where(kept, sorted_probs, mx.inf).min(axis=-1, keepdims=True)
        probs = mx.where(probs < threshold, 0.0, probs)
    return probs / probs.sum(axis=-1, keepdims=True)


def sample(probs: mx.array, key: mx.array) -> mx.array:
    """One token id per row of probabilities, drawn with an explicit key (reproducible)."""
    return mx.random.categorical(mx.log(probs), axis=-1, key=key)


class KeyStream:
    """A reproducible supply of MLX random keys, split from one seed.

    Explicit keys rather than MLX's global generator, so a seeded run is the same whatever
    else the process samples meanwhile.
    """

    def __init__(self, seed: int | None) -> None:
        if seed is None:
            import secrets

            seed = secrets.randbits(63)
        self._key = mx.random.key(seed)

    def next(self) -> mx.array:
        self._key, key = mx.random.split(self._key)
        return key
