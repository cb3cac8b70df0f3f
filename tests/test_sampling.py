"""Sampling keeps the target's distribution exactly, and accepts more than mlx-lm's rule.

Chi-square tests with fixed seeds: deterministic, and with enough samples that the wrong
rules (no residual, a biased residual) fail the same bound the right one passes.
"""

from __future__ import annotations

import itertools
import math

import mlx.core as mx
import numpy as np
import pytest
import tiny
from mlx_lm.generate import speculative_generate_step
from mlx_lm.sample_utils import make_sampler

from macspec.engine.core.sampling import SamplingParams, probabilities
from macspec.engine.core.verify import verify_sampled
from macspec.engine.drafters.model import ModelDrafter
from macspec.engine.generate.loop import Engine, GenerationConfig
from macspec.engine.policy.length import FixedPolicy
from macspec.errors import MacspecError

Z_999 = 3.0902  # standard normal quantile for p = 0.001


def chi2_critical(df: int) -> float:
    """Upper 0.1% point of chi-square (Wilson-Hilferty), to avoid a scipy dependency."""
    return df * (1 - 2 / (9 * df) + Z_999 * math.sqrt(2 / (9 * df))) ** 3


def chi2_statistic(counts: np.ndarray, probs: np.ndarray, min_expected: float = 5.0):
    """Chi-square over cells, rare cells pooled so every expected count is >= min_expected."""
    n = counts.sum()
    order = np.argsort(probs)
    pooled_counts, pooled_probs, acc_c, acc_p = [], [], 0.0, 0.0
    for i in order:
        acc_c += counts[i]
        acc_p += probs[i]
        if acc_p * n >= min_expected:
            pooled_counts.append(acc_c)
            pooled_probs.append(acc_p)
            acc_c = acc_p = 0.0
    if acc_p and pooled_probs:
        pooled_counts[-1] += acc_c
        pooled_probs[-1] += acc_p
    c, p = np.array(pooled_counts), np.array(pooled_probs)
    return float(((c - n * p) ** 2 / (n * p)).sum()), len(c) - 1


def distribution_matches(samples, probs) -> bool:
    counts = np.bincount(np.asarray(samples), minlength=len(probs)).astype(float)
    stat, df = chi2_statistic(counts, np.asarray(probs, dtype=float))
    return stat < chi2_critical(df)


# -- the acceptance rule alone ------------------------------------------------------------
V = 6
N = 20_000


@pytest.fixture(scope="module")
def pq():
    rng = np.random.default_rng(7)
    p = rng.dirichlet(np.ones(V) * 0.7)
    q = rng.dirichlet(np.ones(V) * 0.7)
    return p, q


def first_tokens_with(rule, p, q, seed=0):
    rng = np.random.default_rng(seed)
    drafted = rng.choice(V, size=N, p=q)
    return [rule(int(x), rng) for x in drafted]


def test_rejection_rule_keeps_the_target_distribution(pq):
    p, q = pq
    P = mx.array(np.stack([p, p]).astype(np.float32))
    Q = mx.array(q[None].astype(np.float32))
    keys = mx.random.split(mx.random.key(0), N)
    drafted = np.random.default_rng(0).choice(V, size=N, p=q)
    first = []
    for i in range(N):
        verdict = verify_sampled(P, Q, [int(drafted[i])], keys[i])
        first.append(int(drafted[i]) if verdict.accepted else verdict.token)
    assert distribution_matches(first, p)


def test_the_bound_rejects_wrong_rules(pq):
    """The same test at the same size fails for the classic mistakes: it has the power."""
    p, q = pq

    def no_residual(x, rng):  # on rejection, resample from p itself
        return x if rng.random() < min(1, p[x] / q[x]) else int(rng.choice(V, p=p))

    def biased_residual(x, rng):  # on rejection, p without the rejected token
        if rng.random() < min(1, p[x] / q[x]):
            return x
        r = p.copy()
        r[x] = 0
        return int(rng.choice(V, p=r / r.sum()))

    assert not distribution_matches(first_tokens_with(no_residual, p, q), p)
    assert not distribution_matches(first_tokens_with(biased_residual, p, q), p)


def test_deterministic_guesses_are_treated_as_one_hot(pq):
    """A lookup guess (q is None) is accepted with probability p(x): still exactly p."""
    p, _ = pq
    P = mx.array(np.stack([p, p]).astype(np.float32))
    keys = mx.random.split(mx.random.key(1), N // 2)
    first = [
        2 if (v := verify_sampled(P, None, [2], keys[i])).accepted else v.token
        for i in range(N // 2)
    ]
    assert distribution_matches(first, p)


# -- processing of logits ------------------------------------------------------------------
def numpy_reference(logits, temp, top_k, min_p, top_p):
    x = logits / temp
    if top_k:
        x = np.where(x < np.sort(x)[-top_k], -np.inf, x)
    prob = np.exp(x - x.max())
    prob /= prob.sum()
    if min_p:
        prob = np.where(prob < min_p * prob.max(), 0, prob)
    if top_p < 1:
        order = np.argsort(-prob)
        before = np.cumsum(prob[order]) - prob[order]
        keep = order[before < top_p * prob.sum()]
        prob = np.where(prob < prob[keep].min(), 0, prob)
    return prob / prob.sum()


@pytest.mark.parametrize(
    "temp,top_k,min_p,top_p",
    [
        (1.0, 0, 0.0, 1.0),
        (0.7, 3, 0.0, 1.0),
        (1.3, 0, 0.1, 1.0),
        (1.0, 0, 0.0, 0.8),
        (0.5, 5, 0.05, 0.9),
    ],
)
def test_probabilities_follow_each_filter(temp, top_k, min_p, top_p):
    logits = np.random.default_rng(3).normal(size=(4, 12)).astype(np.float32) * 2
    params = SamplingParams(temperature=temp, top_k=top_k, min_p=min_p, top_p=top_p)
    got = np.array(probabilities(mx.array(logits), params))
    for row, expected_row in zip(got, logits):
        assert np.allclose(row, numpy_reference(expected_row, temp, top_k, min_p, top_p), atol=1e-5)


@pytest.mark.parametrize(
    "bad", [dict(temperature=-0.1), dict(top_p=0.0), dict(top_k=-1), dict(min_p=1.0)]
)
def test_bad_sampling_settings_are_user_errors(bad):
    with pytest.raises(MacspecError):
        SamplingParams(**bad)


# -- end to end through the engine --------------------------------------------------------
class IdTokenizer:
    """The least a tokenizer must offer the engine: EOS ids and a streaming detokenizer."""

    eos_token_ids: frozenset[int] = frozenset()

    class _Detokenizer:
        def reset(self):
            self.text = ""

        def add_token(self, token):
            self.text += chr(ord("a") + token)

        def finalize(self):
            pass

    detokenizer = _Detokenizer()


def tiny_vocab_model(seed):
    args = tiny.model_args(vocab=V, hidden=32, layers=1, heads=2, kv_heads=1, intermediate=64)
    return tiny.random_model(seed, args, scale=4.0)


def exact_two_token_distribution(model, prompt, params):
    """P(x1, x2) by enumeration, with the same logit processing as sampling uses."""

    def next_probs(ids):
        logits = model(mx.array(ids)[None])[0, -1:]
        return np.array(probabilities(logits, params))[0]

    first = next_probs(prompt)
    joint = np.zeros(V * V)
    for a, b in itertools.product(range(V), range(V)):
        joint[a * V + b] = first[a] * next_probs(prompt + [a])[b]
    return joint


@pytest.mark.parametrize(
    "params", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.8, top_k=4)]
)
def test_speculative_sampling_has_the_targets_joint_distribution(params):
    target, draft = tiny_vocab_model(11), tiny_vocab_model(12)
    prompt = [1, 4, 2]
    exact = exact_two_token_distribution(target, prompt, params)
    engine = Engine(target, IdTokenizer(), ModelDrafter(draft), FixedPolicy(2))
    runs = 2500
    outcomes, proposed = [], 0
    for seed in range(runs):
        done = list(
            engine.generate(prompt, GenerationConfig(max_tokens=2, sampling=params, seed=seed))
        )[-1]
        outcomes.append(done.tokens[0] * V + done.tokens[1])
        proposed += done.stats.draft_proposed
    assert proposed == runs  # one guess per run: the target adds the second token itself
    assert distribution_matches(outcomes, exact)


def test_acceptance_is_at_least_mlx_lms_rule_on_the_same_pair(tmp_path):
    tiny.write_tokenizer(tmp_path)
    tok = tiny.tokenizer(tmp_path)
    target = tiny.random_model(0, scale=2.0)  # soft distributions: where the rules differ
    draft = tiny.noisy_copy(target, 0.1, seed=3)
    k, max_tokens = 3, 48
    ours_proposed = ours_accepted = theirs_proposed = theirs_accepted = 0
    for i, text in enumerate(["hello world", "def f(x):", "The quick brown fox", "1, 2, 3"]):
        prompt = tok.encode(text)
        engine = Engine(target, tok, ModelDrafter(draft), FixedPolicy(k))
        config = GenerationConfig(max_tokens=max_tokens, sampling=SamplingParams(1.0), seed=i)
        done = list(engine.generate(prompt, config))[-1]
        ours_proposed += done.stats.draft_proposed
        ours_accepted += done.stats.draft_accepted
        # mlx-lm: a cycle proposes min(k, remaining) and ends at each non-draft token.
        mx.random.seed(i)
        produced = 0
        cycle_start = True
        for _, _, from_draft in speculative_generate_step(
            mx.array(prompt),
            target,
            draft,
            num_draft_tokens=k,
            max_tokens=max_tokens,
            sampler=make_sampler(1.0),
        ):
            if cycle_start:
                theirs_proposed += min(k, max_tokens - produced)
                cycle_start = False
            produced += 1
            theirs_accepted += from_draft
            cycle_start = not from_draft
    ours = ours_accepted / ours_proposed
    theirs = theirs_accepted / theirs_proposed
    print(f"acceptance: macspec {ours:.3f}, mlx-lm rule {theirs:.3f}")
    assert ours >= theirs
    assert ours > 0.3
