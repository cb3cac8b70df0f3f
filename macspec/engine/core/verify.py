"""The acceptance rule: which drafted tokens the target keeps, and the token it adds.

Greedy: keep drafted tokens while they equal the target's argmax, then add the target's argmax.
Sampling (Leviathan et al. 2023; Chen et al. 2023): keep drafted token x with probability
min(1, p(x) / q(x)); at the first rejection, draw from normalize(max(0, p - q)); when all are
kept, draw the bonus token from p. The kept tokens then follow p exactly, and a draft is
kept with probability sum(min(p, q)) per position.

Everything is computed on the device: the verdict stays an array until the engine reads it,
together with the guesses, in the cycle's one wait. `cut` says how many guesses count (the
draft's confidence floor and an end of sequence are applied on the device too); from position
`cut` on, the token is the target's own, as if nothing had been guessed there.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

from macspec.engine.core.sampling import sample


@dataclass(frozen=True)
class Verdict:
    """The outcome of verifying one draft."""

    accepted: int
    """How many drafted tokens were kept (a prefix of the draft)."""
    token: int
    """The target's own token after them: the correction, or the bonus when all were kept."""


def counted_guesses(
    guesses: mx.array, confidence: mx.array | None, floor: float | None
) -> mx.array:
    """How many guesses count, on the device: up to the first one the drafter was less sure
    of than the policy's floor (the end of sequence is cut on the host, after the read)."""
    cut = mx.array(guesses.size, mx.int32)
    if confidence is not None and floor is not None:
        sure = mx.cumprod((confidence >= floor).astype(mx.int32)).sum()
        cut = mx.minimum(cut, sure)
    return cut


def greedy_verdict(logits: mx.array, guesses: mx.array, cut: mx.array) -> tuple[mx.array, mx.array]:
    """(accepted, token) on the device. logits: (k + 1, V) rows scoring each guess position and
    the one after; guesses: (k,) ids; cut: how many of them count."""
    choices = mx.argmax(logits, axis=-1)
    k = guesses.size
    if k == 0:
        return mx.array(0), choices[0]
    match = (guesses.astype(choices.dtype) == choices[:k]) & (mx.arange(k) < cut)
    accepted = mx.cumprod(match.astype(mx.int32)).sum()
    return accepted, mx.take(choices, accepted)


def sampled_verdict(
    p: mx.array, q: mx.array | None, guesses: mx.array, cut: mx.array, key: mx.array
) -> tuple[mx.array, mx.array]:
    """(accepted, token) on the device, by rejection sampling.

    p: (k + 1, V) target probabilities; q: (k, V) draft probabilities the guesses were drawn
    from, or None when the guesses are deterministic (q is then one-hot on each guess).
    """
    k = guesses.size
    accept_key, residual_key = mx.random.split(key)
    if k == 0:
        return mx.array(0), sample(p[:1], residual_key)[0]
    rows = mx.arange(k)
    drafted = guesses.astype(mx.int32)
    p_drafted = p[rows, drafted]
    if q is None:
        q_drafted = mx.ones((k,), p.dtype)
        residual = mx.where(mx.arange(p.shape[-1]) == drafted[:, None], 0.0, p[:k])
    else:
        q_drafted = q[rows, drafted]
        residual = mx.maximum(p[:k] - q, 0.0)
    # u < p/q, written without the division; q(x) > 0 because x was drawn from q.
    kept = (mx.random.uniform(shape=(k,), key=accept_key) * q_drafted < p_drafted) & (rows < cut)
    accepted = mx.cumprod(kept.astype(mx.int32)).sum()
    mass = residual.sum(axis=-1, keepdims=True)
    # p == q on a row leaves no residual mass; then rejection has probability 0 and the
    # row is never used, but it must still be a valid distribution to sample from.
    residual = mx.where(mass > 0, residual / mx.maximum(mass, 1e-30), p[:k])
    # At and past the cut nothing was guessed: the target's own distribution there.
    residual = mx.where(rows[:, None] >= cut, p[:k], residual)
    candidates = sample(mx.concatenate([residual, p[k:]], axis=0), residual_key)
    return accepted, mx.take(candidates, accepted)


def verify_greedy(target_logits: mx.array, draft_tokens: list[int]) -> Verdict:
    """The greedy verdict on a whole draft, read back (for tests and tools)."""
    guesses = mx.array(draft_tokens, mx.uint32)
    accepted, token = greedy_verdict(target_logits, guesses, mx.array(len(draft_tokens)))
    return Verdict(int(accepted.item()), int(token.item()))


def verify_sampled(
    p: mx.array, q: mx.array | None, draft_tokens: list[int], key: mx.array
) -> Verdict:
    """The rejection-sampling verdict on a whole draft, read back (for tests and tools)."""
    guesses = mx.array(draft_tokens, mx.uint32)
    accepted, token = sampled_verdict(p, q, guesses, mx.array(len(draft_tokens)), key)
    return Verdict(int(accepted.item()), int(token.item()))
