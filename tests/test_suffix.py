"""Suffix decoding (engine/drafters/suffix.py): guesses from everything said before, exact.

The store's matching and voting, its bound, and the drafter on the tiny fixtures (greedy equals
mlx-lm's target alone, seeded equals plain seeded decoding) and on the demo pair, where a
retried request is guessed from the first answer."""

from __future__ import annotations

from pathlib import Path

import pytest
import tiny
from losslesskit import PROMPTS, done_of, reference
from mlx_lm import load

import macspec
from macspec.engine.core.events import Cycle
from macspec.engine.core.sampling import SamplingParams
from macspec.engine.drafters.lookup import HybridDrafter, LookupDrafter
from macspec.engine.drafters.model import ModelDrafter
from macspec.engine.drafters.suffix import SaidTokens, SuffixDrafter
from macspec.engine.generate.loop import Engine, GenerationConfig
from macspec.engine.policy.length import FixedPolicy

DEMO = Path(macspec.__file__).parent / "demo"


def test_the_longest_said_suffix_proposes_its_continuation():
    said = SaidTokens(key=2)
    said.begin()
    said.extend([1, 2, 3, 4, 5, 6])
    said.begin()
    said.extend([9, 3, 4, 7, 8])
    # "2 3 4" matches the first sequence by 3 ids, "9 3 4" the second by 3 too: the context
    # "1 2 3 4" matches the first by 4, so it wins.
    found = said.continuation([1, 2, 3, 4], limit=8, factor=4.0, min_prob=0.1)
    assert found.matched == 4 and found.tokens == [5, 6]
    found = said.continuation([9, 3, 4], limit=8, factor=4.0, min_prob=0.1)
    assert found.matched == 3 and found.tokens == [7, 8]  # stops at the sequence's end
    assert said.continuation([5, 5], limit=8, factor=4.0, min_prob=0.1) is None


def test_continuations_are_voted_and_sized_by_the_match():
    said = SaidTokens(key=2)
    for tail in ([7, 7, 7], [7, 7, 7], [7, 7, 8], [7, 9, 9]):
        said.begin()
        said.extend([1, 2, *tail])
    found = said.continuation([0, 1, 2], limit=8, factor=4.0, min_prob=0.1)
    assert found.votes == 4 and found.tokens == [7, 7, 7]  # 4/4, then 3/4, then 2/3
    assert said.continuation([0, 1, 2], 8, 4.0, 0.7).tokens == [7, 7]  # 2/3 < 0.7 stops
    assert said.continuation([0, 1, 2], 8, 0.5, 0.1).tokens == [7]  # 0.5 x 2 matched ids


def test_the_store_is_bounded_and_evicts_the_oldest():
    said = SaidTokens(max_tokens=100, key=2)
    for i in range(30):
        said.begin()
        said.extend([1000 + i, 2000 + i, 1, 2, 3, 4])
    assert len(said) <= 100
    assert said.continuation([1000, 2000], 4, 4.0, 0.1) is None  # evicted
    assert said.continuation([1029, 2029], 8, 4.0, 0.1).tokens == [1, 2, 3, 4]
    assert len(said.tokens) <= 200  # compacted, not just marked dead


def test_a_chats_next_turn_continues_its_sequence():
    drafter = SuffixDrafter()
    drafter.start([1, 2, 3])
    drafter.propose([1, 2, 3, 4, 5], 4, SamplingParams(), None, None)
    size = len(drafter.said)
    drafter.start([1, 2, 3, 4, 5, 6])  # the history, then the new turn: only 6 is new
    assert len(drafter.said) == size + 1
    drafter.start([7, 8])  # another conversation: a sequence of its own
    assert len(drafter.said) == size + 4  # the separator and two ids


@pytest.fixture(scope="module")
def fixture_models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tok")
    tiny.write_tokenizer(folder)
    return tiny.tokenizer(folder), tiny.random_model(0, scale=3.0)


def test_greedy_is_the_target_alone_and_earlier_answers_are_guessed(fixture_models):
    tok, target = fixture_models
    said = SaidTokens()
    engine = Engine(target, tok, SuffixDrafter(said), FixedPolicy(8))
    kept = 0
    for round_ in range(2):  # the second round repeats every request
        for text in PROMPTS[:6]:
            prompt = tok.encode(text)
            done = done_of(engine.generate(prompt, GenerationConfig(max_tokens=24)))
            assert done.tokens == reference(target, prompt, 24), text
            kept += done.stats.draft_accepted if round_ else 0
    assert kept > 6 * 10  # the retried requests' answers came from the first round


def test_seeded_sampling_is_plain_seeded_sampling(fixture_models):
    tok, target = fixture_models
    drafter = SuffixDrafter()
    for seed in range(3):
        prompt = tok.encode(PROMPTS[seed])
        config = GenerationConfig(max_tokens=20, sampling=SamplingParams(0.8), seed=seed)
        plain = done_of(Engine(target, tok).generate(prompt, config))
        for _ in range(2):
            engine = Engine(target, tok, drafter, FixedPolicy(6))
            assert done_of(engine.generate(prompt, config)).tokens == plain.tokens


def per_pass(engine, prompt, max_tokens=96):
    events = list(engine.generate(prompt, GenerationConfig(max_tokens=max_tokens)))
    cycles = [e for e in events if isinstance(e, Cycle)]
    return len(done_of(events).tokens) / len(cycles)


def test_a_retried_request_is_guessed_from_its_first_answer():
    """The demo pair, -k 8: the same request again keeps >= 2.5 tokens per target pass with
    suffix decoding, at least 1.5 times prompt lookup's (which sees only this request)."""
    target, tok = load(str(DEMO / "target"))
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "Write a Python function `mean(xs)`: Return the mean."}],
        add_generation_prompt=True,
    )
    said = SaidTokens()
    first = per_pass(Engine(target, tok, SuffixDrafter(said), FixedPolicy(8)), prompt)
    retried = per_pass(Engine(target, tok, SuffixDrafter(said), FixedPolicy(8)), prompt)
    lookup = per_pass(Engine(target, tok, LookupDrafter(), FixedPolicy(8)), prompt)
    assert retried >= 2.5 and retried >= 1.5 * lookup, (first, retried, lookup)


def test_hybrid_drafts_with_the_model_where_the_suffix_has_nothing(fixture_models):
    tok, target = fixture_models
    draft = tiny.noisy_copy(target, 0.05, seed=1)
    drafter = HybridDrafter(ModelDrafter(draft), lookup=SuffixDrafter())
    engine = Engine(target, tok, drafter, FixedPolicy(4))
    sources = set()
    for text in PROMPTS[:4] * 2:
        prompt = tok.encode(text)
        done = done_of(engine.generate(prompt, GenerationConfig(max_tokens=20)))
        assert done.tokens == reference(target, prompt, 20)
        sources |= {s for s, (proposed, _) in done.stats.by_source.items() if proposed}
    assert sources == {"model", "suffix"}
