"""Seeded sampling you can check: with a seed, speculative output is plain decoding's output
with that seed, token for token, whatever drafts (drafter-invariant coupling, Gumbel-max noise
keyed by seed and absolute position)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tiny
from losslesskit import PROMPTS, done_of
from samplingkit import exact_joint
from test_sampling import IdTokenizer, distribution_matches

from macspec.cli import main
from macspec.engine.core.events import Token
from macspec.engine.core.sampling import CoupledNoise, SamplingParams
from macspec.engine.drafters.lookup import HybridDrafter, LookupDrafter
from macspec.engine.drafters.model import ModelDrafter
from macspec.engine.generate.loop import Engine, GenerationConfig
from macspec.engine.policy.length import AutoPolicy, FixedPolicy

# lookup drafting needs a prompt that repeats itself
REPEATING = "the cat sat on the mat. the cat sat on the"
SETTINGS = [
    SamplingParams(temperature=0.7, top_p=0.9),
    SamplingParams(temperature=1.0, top_k=20),
    SamplingParams(temperature=0.7, min_p=0.05),
    SamplingParams(temperature=1.0),
]
CONFIGS = {
    "k=1": lambda d: (ModelDrafter(d), FixedPolicy(1)),
    "k=2": lambda d: (ModelDrafter(d), FixedPolicy(2)),
    "k=4": lambda d: (ModelDrafter(d), FixedPolicy(4)),
    "k=8": lambda d: (ModelDrafter(d), FixedPolicy(8)),
    "auto": lambda d: (ModelDrafter(d), AutoPolicy()),
    "lookup": lambda d: (LookupDrafter(), FixedPolicy(4)),
    "hybrid": lambda d: (HybridDrafter(ModelDrafter(d), min_guess=1), FixedPolicy(4)),
}


@pytest.fixture(scope="module")
def models():
    target = tiny.random_model(0, scale=1.5)  # soft distributions: sampling matters
    return target, {
        "close": tiny.noisy_copy(target, 0.05, seed=1),
        "unrelated": tiny.random_model(9),
    }


def check_identical(tok, target, drafts, prompts, seeds, max_tokens=12) -> dict[str, float]:
    """Every configuration's tokens equal plain decoding's; returns acceptance by config."""
    accepted = {name: [0, 0] for name in CONFIGS}
    plain = Engine(target, tok)
    engines = {
        (name, draft): Engine(target, tok, *make(drafts[draft]))
        for name, make in CONFIGS.items()
        for draft in drafts
    }
    for i, text in enumerate(prompts):
        prompt = tok.encode(text)
        draft = list(drafts)[i % len(drafts)]  # a close draft and an unrelated one in turn
        for seed in seeds:
            params = SETTINGS[(i + seed) % len(SETTINGS)]
            config = GenerationConfig(max_tokens=max_tokens, sampling=params, seed=seed)
            want = done_of(plain.generate(prompt, config))
            assert want.stats.sampler == "coupled"
            for name in CONFIGS:
                done = done_of(engines[(name, draft)].generate(prompt, config))
                assert done.tokens == want.tokens, f"{name} {draft} {text!r} seed {seed}"
                accepted[name][0] += done.stats.draft_accepted
                accepted[name][1] += done.stats.draft_proposed
    return {name: a / p if p else 0.0 for name, (a, p) in accepted.items()}


def test_seeded_output_is_plain_decodings_whatever_drafts(tok, models):
    target, drafts = models
    acceptance = check_identical(tok, target, drafts, [*PROMPTS[:19], REPEATING], seeds=(0, 1, 2))
    assert acceptance["k=2"] > 0.2  # guesses were kept and rejected: the rule was exercised


def test_seeded_output_is_plain_decodings_on_4_bit_models(tok, models):
    target, drafts = models
    drafts = {"close": tiny.quantized(drafts["close"])}
    check_identical(tok, tiny.quantized(target), drafts, PROMPTS[:6], seeds=(5,))


def test_noise_depends_on_seed_and_position_only():
    noise = CoupledNoise(7)
    whole = np.array(noise.rows(10, 5, 50))
    assert np.allclose(whole[2], np.array(noise.rows(12, 1, 50))[0])
    assert not np.allclose(whole[0], np.array(CoupledNoise(8).rows(10, 1, 50))[0])
    assert not np.allclose(whole[0], whole[1])
    # Gumbel(0, 1): mean ~0.577, standard deviation pi / sqrt(6) ~1.28
    sample = np.array(noise.rows(0, 400, 500)).ravel()
    assert abs(sample.mean() - 0.5772) < 0.02 and abs(sample.std() - 1.2825) < 0.02


def test_the_coupled_sampler_has_the_targets_distribution():
    """Over many seeds, the seeded tokens of a speculative run follow p exactly."""
    V = 6
    target = tiny.random_model(
        11, tiny.model_args(vocab=V, hidden=32, layers=1, heads=2, kv_heads=1, intermediate=64), 4.0
    )
    draft = tiny.random_model(
        12, tiny.model_args(vocab=V, hidden=32, layers=1, heads=2, kv_heads=1, intermediate=64), 4.0
    )
    params = SamplingParams(temperature=1.0)
    prompt = [1, 4, 2]
    exact = exact_joint(target, prompt, params, V, length=2)
    engine = Engine(target, IdTokenizer(), ModelDrafter(draft), FixedPolicy(2))
    outcomes = []
    for seed in range(3000):
        done = done_of(
            engine.generate(prompt, GenerationConfig(max_tokens=2, sampling=params, seed=seed))
        )
        outcomes.append(done.tokens[0] * V + done.tokens[1])
    assert distribution_matches(outcomes, exact)


def test_noise_keyed_by_cycle_instead_of_position_is_caught(tok, models, monkeypatch):
    """The wrong variant: noise drawn per call (per pass) rather than per position. The
    identity with plain decoding then breaks: the check has the power to see it."""
    target, drafts = models
    calls = []
    rows = CoupledNoise.rows

    def per_call(self, first, count, vocab):
        calls.append(1)
        return rows(self, len(calls) * 1000, count, vocab)

    monkeypatch.setattr(CoupledNoise, "rows", per_call)
    with pytest.raises(AssertionError):
        check_identical(tok, target, {"close": drafts["close"]}, PROMPTS[:4], seeds=(0,))


def test_stops_and_cancel_stay_exact_under_the_coupled_sampler(tok, models):
    target, drafts = models
    prompt = tok.encode("Once upon a time")
    config = GenerationConfig(max_tokens=40, sampling=SETTINGS[0], seed=3)
    want = done_of(Engine(target, tok).generate(prompt, config))
    stop = want.text[10:13]
    engine = Engine(target, tok, ModelDrafter(drafts["close"]), FixedPolicy(4))
    stopped = done_of(
        engine.generate(prompt, GenerationConfig(**{**config.__dict__, "stop_strings": (stop,)}))
    )
    assert stopped.text == want.text[: want.text.index(stop)]
    # Cancel after 5 tokens, then the same prompt again: the caches rolled back exactly.
    seen = []
    for event in engine.generate(prompt, config, cancelled=lambda: len(seen) >= 5):
        if isinstance(event, Token):
            seen.append(event.id)
    assert seen == want.tokens[:5]
    assert done_of(engine.generate(prompt, config)).tokens == want.tokens


def test_the_coupled_rule_keeps_fewer_guesses_than_the_rejection_rule(tok, models):
    """Both are exact; the rejection rule keeps sum(min(p, q)) per guess, the coupled one at
    least (1 - d) / (1 + d) for total variation d: it pays a little acceptance for identity."""
    target, drafts = models
    rates = {}
    for sampler in ("coupled", "rejection"):
        engine = Engine(target, tok, ModelDrafter(drafts["close"]), FixedPolicy(3))
        kept = proposed = 0
        for i, text in enumerate(PROMPTS):
            config = GenerationConfig(max_tokens=24, sampling=SETTINGS[0], seed=i, sampler=sampler)
            done = done_of(engine.generate(tok.encode(text), config))
            kept, proposed = kept + done.stats.draft_accepted, proposed + done.stats.draft_proposed
        rates[sampler] = kept / proposed
    assert 0.2 < rates["coupled"] <= rates["rejection"] + 0.05


def test_run_records_the_sampler_and_checks_it(tmp_path, capsys):
    target = tiny.random_model(0, scale=1.5)
    folder = tiny.save_model(target, tmp_path / "t")
    base = ["run", "hi", "--model", str(folder), "--temp", "0.8", "--max-tokens", "8", "--json"]
    assert main([*base, "--seed", "4"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["sampler"] == "coupled"
    assert main([*base, "--seed", "4", "--no-draft"]) == 0
    assert json.loads(capsys.readouterr().out)["tokens"] == record["tokens"]
    assert main([*base, "--sampler", "rejection"]) == 0
    assert json.loads(capsys.readouterr().out)["sampler"] == "rejection"
    assert main([*base, "--sampler", "coupled"]) == 2
    assert "--sampler coupled needs a --seed" in capsys.readouterr().err
