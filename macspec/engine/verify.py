"""The acceptance rule: which drafted tokens the target keeps, and the token it adds.

Greedy: keep drafted tokens while they equal the target's argmax, then add the target's argmax.
Sampling (Leviathan et al. 2023; Chen et al. 2023): keep drafted token x with probability
min(1, p(x) / q(x)); at the first rejection, draw from normalize(max(0, p - q)); when all are
kept, draw the bonus token from p. The kept tokens then follow p exactly, and a draft is
kept with probability sum(min(p, q)) per position.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

from macspec.engine.sampling import sample


@dataclass(frozen=True)
class Verdict:
    """The outcome of verifying one draft."""

    accepted: int
    """How many drafted tokens were kept (a prefix of the draft)."""
    token: int
    """The target's own token after them: the correction, or the bonus when all were kept."""


def verify_greedy(target_logits: mx.array, draft_tokens: list[int]) -> Verdict:
    """target_logits: (k + 1, V) rows scoring each draft position and the one after."""
    choices = mx.argmax(target_logits, axis=-1).tolist()
    accepted = 0
    while accepted < len(draft_tokens) and draft_tokens[accepted] == choices[accepted]:
        accepted += 1
    return Verdict(accepted, choices[accepted])


def verify_sampled(
    p: mx.array,
    q: mx.array | None,
    draft_tokens: list[int],
    key: mx.array,
) -> Verdict:
    """Rejection sampling over one draft.

    p: (k + 1, V) target probabilities; q: (k, V) draft probabilities the tokens were drawn
    from, or None when the guesses are deterministic (q is one-hot on each guess).
    """
    k = len(draft_tokens)
    if k == 0:
        return Verdict(0, sample(p[0], key).item())
    accept_key, residual_key = mx.random.split(key)
    drafted = mx.array(draft_tokens)
    rows = mx.arange(k)
    p_drafted = p[rows, drafted]
    if q is None:
        q_drafted = mx.ones((k,), p.dtype)
        residual = mx.where(mx.arange(p.shape[-1]) == drafted[:, None], 0.0, p[:k])
    else:
        q_drafted = q[rows, drafted]
        residual = mx.maximum(p[:k] - q, 0.0)
    # u < p/q, written without the division; q(x) > 0 because x was drawn from q.
    kept = mx.random.uniform(shape=(k,), key=accept_key) * q_drafted < p_drafted
    # Draw every position's replacement at once: one sync per cycle instead of two.
    mass = residual.sum(axis=-1, keepdims=True)
    # p == q on a row leaves no residual mass; then rejection has probability 0 and the
    # row is never used, but it must still be a valid distribution to sample from.
    residual = mx.where(mass > 0, residual / mx.maximum(mass, 1e-30), p[:k])
    candidates = sample(mx.concatenate([residual, p[k:]], axis=0), residual_key)
    mx.eval(kept, candidates)
    kept_list, candidate_list = kept.tolist(), candidates.tolist()
    accepted = 0
    while accepted < k and kept_list[accepted]:
        accepted += 1
    return Verdict(accepted, candidate_list[accepted])
