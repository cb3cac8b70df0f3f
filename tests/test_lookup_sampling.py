"""Prompt lookup and hybrid drafting at temperature > 0: the target's distribution, exactly."""

from __future__ import annotations

from collections import Counter

import mlx.core as mx
import pytest
from samplingkit import resample_from_p
from tiny import model_args, noisy_copy, random_model

import macspec.engine.generate.loop
from macspec.engine.core.sampling import SamplingParams, probabilities
from macspec.engine.drafters.lookup import HybridDrafter, LookupDrafter
from macspec.engine.drafters.model import ModelDrafter
from macspec.engine.generate.loop import Engine, GenerationConfig
from macspec.engine.policy.length import FixedPolicy


# -- sampling ----------------------------------------------------------------------------------
class _Detokenizer:
    def reset(self):
        self.ids = []

    def add_token(self, token):
        self.ids.append(token)

    def finalize(self):
        pass

    @property
    def text(self):
        return "".join(chr(65 + i) for i in self.ids)


class _TinyVocabTokenizer:
    """Just what the engine uses, for a model with a 4-id vocabulary and no EOS."""

    eos_token_ids = [10**6]

    def __init__(self):
        self.detokenizer = _Detokenizer()


VOCAB, LENGTH, SAMPLES = 4, 3, 1000
SAMPLED = SamplingParams(temperature=1.0, top_k=3)  # top-k: some guesses have p = 0


def exact_distribution(model, prompt: list[int]) -> dict[tuple[int, ...], float]:
    """P(continuation) for every continuation of LENGTH ids, by enumeration."""
    probs: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(LENGTH):
        prefixes = list(probs)
        logits = model(mx.array([prompt + list(p) for p in prefixes]))[:, -1, :]
        rows = probabilities(logits, SAMPLED).tolist()
        probs = {
            p + (t,): probs[p] * row[t] for p, row in zip(prefixes, rows) for t in range(VOCAB)
        }
    return probs


def chi_square(counts: Counter, expected: dict, samples: int) -> tuple[float, int]:
    """Pearson's statistic and its degrees of freedom, rare outcomes pooled into one bin."""
    observed, bins, pooled_o, pooled_e = 0.0, 0, 0, 0.0
    for outcome, p in expected.items():
        if p * samples >= 5:
            observed += (counts[outcome] - p * samples) ** 2 / (p * samples)
            bins += 1
        else:
            pooled_o, pooled_e = pooled_o + counts[outcome], pooled_e + p * samples
    if pooled_e > 0:
        observed += (pooled_o - pooled_e) ** 2 / pooled_e
        bins += 1
    return observed, bins - 1


def sampled_counts(drafter, model, prompt: list[int]) -> tuple[Counter, Counter]:
    engine = Engine(model, _TinyVocabTokenizer(), drafter, FixedPolicy(3))
    counts, sources = Counter(), Counter()
    for seed in range(SAMPLES):
        config = GenerationConfig(
            max_tokens=LENGTH, sampling=SAMPLED, seed=seed, sampler="rejection"
        )
        done = list(engine.generate(prompt, config))[-1]
        counts[tuple(done.tokens)] += 1
        for source, (proposed, _) in done.stats.by_source.items():
            sources[source] += proposed
    return counts, sources


TINY_PROMPT = [0, 1, 2, 3, 0, 1, 2, 0, 1, 3, 2, 0, 1]


@pytest.fixture(scope="module")
def tiny_vocab_target():
    model = random_model(5, model_args(vocab=VOCAB, hidden=32, intermediate=64), scale=1.5)
    return model, exact_distribution(model, TINY_PROMPT)


@pytest.mark.parametrize("kind", ["lookup", "hybrid"])
def test_sampled_output_has_the_targets_distribution(kind: str, tiny_vocab_target):
    model, expected = tiny_vocab_target
    if kind == "lookup":
        drafter = LookupDrafter()
    else:
        drafter = HybridDrafter(ModelDrafter(noisy_copy(model, 0.3, seed=1)), min_guess=1)
    counts, sources = sampled_counts(drafter, model, TINY_PROMPT)
    statistic, df = chi_square(counts, expected, SAMPLES)
    # Mean df, sd sqrt(2 df) under the right rule; the wrong rule below lands far above.
    assert statistic < df + 4 * (2 * df) ** 0.5, (statistic, df)
    assert sources["lookup"] > SAMPLES  # lookup proposed in most generations
    if kind == "hybrid":
        assert sources["model"] > SAMPLES // 10


def test_the_distribution_check_catches_a_wrong_rule(tiny_vocab_target, monkeypatch):
    model, expected = tiny_vocab_target
    monkeypatch.setattr(macspec.engine.generate.loop, "sampled_verdict", resample_from_p)
    counts, _ = sampled_counts(LookupDrafter(), model, TINY_PROMPT)
    statistic, df = chi_square(counts, expected, SAMPLES)
    assert statistic > df + 4 * (2 * df) ** 0.5, (statistic, df)
