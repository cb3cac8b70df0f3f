"""The sampled-distribution harness: the exact joint distribution of a target's next tokens by
enumeration, the joint an engine samples, and the classic wrong rule to show the test's power."""

from __future__ import annotations

import itertools

import mlx.core as mx
import numpy as np

from macspec.engine.core.sampling import SamplingParams, probabilities, sample
from macspec.engine.generate.loop import Engine, GenerationConfig


def exact_joint(target, prompt: list[int], params: SamplingParams, vocab: int, length: int = 3):
    """P(x1 .. x_length) over every sequence, with the same logit processing as sampling."""

    def probs(ids):
        return np.array(probabilities(target(mx.array(ids)[None])[0, -1:], params))[0]

    joint = np.zeros(vocab**length)
    for ids in itertools.product(range(vocab), repeat=length):
        p = 1.0
        for i in range(length):
            p *= probs(prompt + list(ids[:i]))[ids[i]]
        joint[np.ravel_multi_index(ids, (vocab,) * length)] = p
    return joint


def sampled_joint(
    engine: Engine, prompt: list[int], params: SamplingParams, vocab: int, runs: int, length=3
) -> tuple[list[int], int]:
    """(outcome per run, guesses rejected in all) for `runs` seeded generations under the
    rejection rule: the seeded default, 'coupled', never reaches `sampled_verdict`, and its
    exactness is identity with plain decoding (test_coupled), not a distribution."""
    outcomes, rejected = [], 0
    for seed in range(runs):
        config = GenerationConfig(
            max_tokens=length, sampling=params, seed=seed, sampler="rejection"
        )
        done = list(engine.generate(prompt, config))[-1]
        outcomes.append(int(np.ravel_multi_index(tuple(done.tokens), (vocab,) * length)))
        rejected += done.stats.draft_proposed - done.stats.draft_accepted
    return outcomes, rejected


def resample_from_p(p, q, guesses, cut, key):
    """loop.sampled_verdict with the classic mistake: on a rejection, resample from p itself
    instead of the residual max(0, p - q). Same signature, on the device."""
    k = guesses.size
    accept_key, sample_key = mx.random.split(key)
    if k == 0:
        return mx.array(0), sample(p[:1], sample_key)[0]
    rows = mx.arange(k)
    drafted = guesses.astype(mx.int32)
    q_drafted = q[rows, drafted] if q is not None else mx.ones((k,))
    kept = (mx.random.uniform(shape=(k,), key=accept_key) * q_drafted < p[rows, drafted]) & (
        rows < cut
    )
    accepted = mx.cumprod(kept.astype(mx.int32)).sum()
    return accepted, mx.take(sample(p, sample_key), accepted)
