"""Sampling settings -> probability vectors. Pure functions over MLX arrays.

The verifier needs the *distributions* p (target) and q (draft), not just samples, so both
models go through exactly the same processing here; greedy decoding never builds them.
"""

from __future__ import annotations

import math
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
        if not 0 <= self.temperature < math.inf:
            raise MacspecError(f"--temp must be a finite number >= 0, got {self.temperature}")
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


# -- coupled sampling: the same noise for the target and every drafter ----------------------------
_U32 = mx.uint32


def _mix(x: mx.array) -> mx.array:
    """A 32-bit integer hash (Wellons' lowbias32): neighbouring inputs give unrelated outputs."""
    x = x ^ (x >> 16)
    x = x * mx.array(0x7FEB352D, _U32)
    x = x ^ (x >> 15)
    x = x * mx.array(0x846CA68B, _U32)
    return x ^ (x >> 16)


class CoupledNoise:
    """Gumbel noise that depends only on (seed, absolute position, token id).

    Every sampler in a seeded run picks argmax(log p~ + g(seed, position)): plain decoding, the
    verifier, and every drafter with the same g. The target's token at each position is then its
    own seeded sample, whatever drafted, however positions were grouped into passes; its
    distribution is exactly p~ (the Gumbel-max trick); a guess is kept when it equals the
    target's pick (Daliri, Musco and Suresh 2024: drafter-invariant speculative decoding).
    Computed on the device, for the positions a pass scores: no wait.
    """

    def __init__(self, seed: int):
        if not 0 <= seed < 2**64:
            raise ValueError(f"seed must be in [0, 2**64), got {seed}")
        self.seed = seed
        low, high = seed & 0xFFFFFFFF, seed >> 32
        self._base = _mix(_mix(mx.array(low, _U32)) ^ mx.array(high, _U32))

    def rows(self, first: int, count: int, vocab: int) -> mx.array:
        """(count, vocab) Gumbel noise for positions first .. first + count - 1."""
        positions = mx.arange(first, first + count, dtype=_U32)[:, None]
        ids = mx.arange(vocab, dtype=_U32)[None, :]
        h = _mix(self._base ^ _mix(positions * mx.array(0x9E3779B9, _U32) + 1))
        h = _mix(h ^ (ids * mx.array(0x85EBCA6B, _U32)))
        u = ((h >> 8).astype(mx.float32) + 0.5) * (1.0 / (1 << 24))  # in (0, 1)
        return -mx.log(-mx.log(u))

    def choose(self, probs: mx.array, first: int) -> mx.array:
        """(n, V) probabilities for positions first .. -> (n,) ids: argmax(log p + g)."""
        return mx.argmax(mx.log(probs) + self.rows(first, probs.shape[0], probs.shape[-1]), axis=-1)


class Draws:
    """How a drafter turns one cycle's distributions into guesses: categorical draws with split
    keys (the rejection rule), or the coupled sampler's argmax at each guess's position."""

    def __init__(
        self, count: int, key: mx.array | None = None, noise: CoupledNoise | None = None,
        first: int = 0,
    ):  # fmt: skip
        self.noise, self.first = noise, first
        self.keys = mx.random.split(key, count) if key is not None and count else None

    def __call__(self, probs: mx.array, i: int) -> mx.array:
        """The i-th guess, from probs (1, V)."""
        if self.noise is not None:
            return self.noise.choose(probs, self.first + i)
        return sample(probs, self.keys[i])


SAMPLERS = ("coupled", "rejection")
"""`--sampler`: how sampled runs verify (greedy runs need neither)."""


def choose_sampler(sampler: str | None, seed: int | None) -> str:
    """`--sampler`, or the default: the coupled rule with a seed, the rejection rule without."""
    if sampler is not None and sampler not in SAMPLERS:
        raise MacspecError(f"--sampler must be one of {', '.join(SAMPLERS)}, got {sampler!r}")
    if sampler == "coupled" and seed is None:
        raise MacspecError("--sampler coupled needs a --seed (its noise is keyed by the seed)")
    return sampler or ("coupled" if seed is not None else "rejection")


class Randomness:
    """A sampled run's randomness: a key stream (the rejection rule, any seed or none), or the
    coupled noise (a seed: output identical to plain decoding with that seed)."""

    def __init__(self, sampler: str, seed: int | None):
        self.sampler = sampler
        self.keys = KeyStream(seed) if sampler == "rejection" else None
        self.noise = CoupledNoise(seed) if sampler == "coupled" else None

    def pick(self, probs: mx.array, position: int) -> mx.array:
        """The target's token at `position` from probs (1, V)."""
        if self.noise is not None:
            return self.noise.choose(probs, position)
        return sample(probs, self.keys.next())

    def draws(self, count: int, first: int) -> Draws:
        """A drafter's draws for `count` guesses at positions first, first + 1, ..."""
        if self.noise is not None:
            return Draws(count, noise=self.noise, first=first)
        return Draws(count, key=self.keys.next())
