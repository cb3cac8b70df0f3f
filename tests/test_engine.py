"""Greedy losslessness, exact counts, stops and cache rollback of the engine.

The reference is mlx-lm's own target-only greedy decoding (`generate_step`).
"""

from __future__ import annotations

import pytest
import tiny
from losslesskit import PROMPTS, reference

from macspec.engine.core.events import Cycle, Done, Source, Token
from macspec.engine.drafters.model import ModelDrafter
from macspec.engine.generate.loop import Engine, GenerationConfig
from macspec.engine.policy.length import AutoPolicy, DraftPolicy, FixedPolicy
from macspec.errors import MacspecError

MAX_TOKENS = 24


@pytest.fixture(scope="module")
def target():
    return tiny.random_model(0, scale=3.0)


@pytest.fixture(scope="module")
def drafts(target):
    return {
        "unrelated": tiny.random_model(99, scale=3.0),
        "noisy": tiny.noisy_copy(target, 0.01, seed=1),
        "self": target,
    }


def run(engine: Engine, prompt: list[int], **config) -> tuple[Done, list]:
    events = list(engine.generate(prompt, GenerationConfig(**config)))
    assert isinstance(events[-1], Done)
    return events[-1], events


def make_policy(spec):
    return AutoPolicy() if spec == "auto" else FixedPolicy(spec)


@pytest.fixture(scope="module")
def prompt_ids(tok):
    return [tok.encode(p) for p in [*PROMPTS, "~!@#$%^&*()", "return None"]]


@pytest.fixture(scope="module")
def references(target, prompt_ids):
    return [reference(target, p, MAX_TOKENS) for p in prompt_ids]


@pytest.mark.parametrize("draft_name", ["unrelated", "noisy", "self"])
@pytest.mark.parametrize("policy", [1, 2, 4, 8, "auto"])
def test_greedy_output_is_the_targets(
    tok, target, drafts, prompt_ids, references, draft_name, policy
):
    engine = Engine(target, tok, ModelDrafter(drafts[draft_name]), make_policy(policy))
    proposed = accepted = 0
    for prompt, expected in zip(prompt_ids, references):
        done, events = run(engine, prompt, max_tokens=MAX_TOKENS)
        assert done.tokens == expected
        assert done.finish_reason == ("length" if len(expected) == MAX_TOKENS else "stop")
        assert [e.id for e in events if isinstance(e, Token)] == expected
        proposed += done.stats.draft_proposed
        accepted += done.stats.draft_accepted
    if policy != "auto":  # auto may settle on plain decoding on a CPU and propose little
        rate = accepted / proposed
        if draft_name == "unrelated":
            assert rate < 0.2
        elif draft_name == "noisy":
            assert rate > 0.6
        else:
            assert rate == 1.0


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_self_draft_accepts_everything_and_makes_k_plus_one_per_pass(
    tok, target, prompt_ids, references, k
):
    engine = Engine(target, tok, ModelDrafter(target), FixedPolicy(k))
    cycles = 3
    checked = 0
    for prompt in prompt_ids:
        expected = reference(target, prompt, (k + 1) * cycles)
        if len(expected) < (k + 1) * cycles:
            continue  # an early EOS would cut a cycle short
        done, _ = run(engine, prompt, max_tokens=(k + 1) * cycles)
        assert done.tokens == expected
        assert done.stats.acceptance_rate == 1.0
        assert done.stats.tokens_per_pass == k + 1
        assert done.stats.target_passes == cycles
        assert done.stats.accepted_histogram[k] == cycles
        assert done.sources == ([Source.DRAFT] * k + [Source.TARGET]) * cycles
        # The decode rate counts only what came after the first token's pass.
        assert done.stats.steady_tokens == (k + 1) * (cycles - 1)
        checked += 1
    assert checked >= 10
    # Every token from the first pass: no rate to speak of (it read thousands of tok/s).
    done, _ = run(engine, prompt_ids[0], max_tokens=k + 1)
    assert done.stats.target_passes == 1 and done.stats.decode_tokens_per_s is None


def test_plain_decoding_is_mlx_lm_greedy(tok, target, prompt_ids, references):
    engine = Engine(target, tok)
    ended = 0
    for prompt, expected in zip(prompt_ids, references):
        done, _ = run(engine, prompt, max_tokens=MAX_TOKENS)
        assert done.tokens == expected
        # One pass per token; the pass that produced EOS counts, its EOS is not delivered.
        eos_pass = 1 if done.finish_reason == "stop" else 0
        assert done.stats.target_passes == len(expected) + eos_pass
        assert done.stats.acceptance_rate is None
        # ... and the EOS the target chose is a decided token: plain decoding reads 1.00.
        assert done.stats.end_tokens == eos_pass
        assert done.stats.tokens_per_pass == 1.0
        ended += eos_pass
    assert ended  # some answers end on EOS, so both cases are checked


def test_a_one_id_prompt_is_answered_and_no_ids_is_refused(tok, target, drafts):
    """The rule of every path (macspec.errors.is_empty_prompt): a prompt of one id (a single
    space) is decoded as the target alone decodes it, drafted or not; no ids is one line."""
    plain, spec = (
        Engine(target, tok),
        Engine(target, tok, ModelDrafter(drafts["self"]), FixedPolicy(2)),
    )
    done, _ = run(plain, [tok.encode(" ")[-1]], max_tokens=6)
    assert run(spec, [tok.encode(" ")[-1]], max_tokens=6)[0].tokens == done.tokens
    with pytest.raises(MacspecError, match=r"^the prompt is empty \(no ids\)$"):
        run(plain, [], max_tokens=6)


class NeverGuess(DraftPolicy):
    """A policy that keeps a drafter but never asks it: what `auto` does where guessing
    cannot pay."""

    confidence_floor = None

    def draft_length(self) -> int:
        return 0

    def observe(self, cycle) -> None:
        pass


def test_a_run_that_never_guessed_says_why(tok, target, drafts, prompt_ids):
    from macspec.engine.core.stats import summary_line
    from macspec.engine.drafters.lookup import LookupDrafter

    engine = Engine(target, tok, ModelDrafter(drafts["noisy"]), NeverGuess())
    done, _ = run(engine, prompt_ids[0], max_tokens=8)
    assert done.stats.draft_proposed == 0
    assert done.stats.plain_reason == "plain: guessing does not pay here"
    assert "plain: guessing does not pay here" in summary_line(done.stats, "length")
    # Lookup asked every cycle, but a short prompt with no repeats offers nothing to copy.
    engine = Engine(target, tok, LookupDrafter(), FixedPolicy(4))
    done, _ = run(engine, tok.encode("xq"), max_tokens=3)
    assert done.stats.draft_proposed == 0
    assert done.stats.plain_reason == "no guesses worth verifying"
    # With guesses, the line says how many the share is of.
    engine = Engine(target, tok, ModelDrafter(drafts["self"]), FixedPolicy(2))
    done, _ = run(engine, prompt_ids[0], max_tokens=9)
    assert done.stats.plain_reason is None
    proposed = done.stats.draft_proposed
    assert f"acceptance 100% of {proposed} guesses" in summary_line(done.stats, "length")


def test_quantized_pair_is_lossless(tok, target, prompt_ids):
    target_q = tiny.quantized(target)
    draft_q = tiny.quantized(tiny.noisy_copy(target, 0.05, seed=2))
    for policy in (FixedPolicy(3), AutoPolicy()):
        engine = Engine(target_q, tok, ModelDrafter(draft_q), policy)
        for prompt in prompt_ids:
            done, _ = run(engine, prompt, max_tokens=MAX_TOKENS)
            assert done.tokens == reference(target_q, prompt, MAX_TOKENS)


def test_cycle_records_add_up(tok, target, drafts, prompt_ids, references):
    # A prompt that runs to max_tokens: every accepted guess is then also delivered.
    prompt = next(p for p, ref in zip(prompt_ids, references) if len(ref) == MAX_TOKENS)
    engine = Engine(target, tok, ModelDrafter(drafts["noisy"]), FixedPolicy(4))
    done, events = run(engine, prompt, max_tokens=MAX_TOKENS)
    cycles = [e for e in events if isinstance(e, Cycle)]
    stats = done.stats
    assert stats.target_passes == len(cycles)
    assert stats.draft_proposed == sum(c.proposed for c in cycles)
    assert stats.draft_accepted == sum(c.accepted for c in cycles)
    assert sum(stats.accepted_histogram) == sum(1 for c in cycles if c.proposed)
    assert stats.generated_tokens == len(done.tokens)
    assert stats.tokens_per_pass == pytest.approx(len(done.tokens) / len(cycles))
    assert done.sources.count(Source.DRAFT) == stats.draft_accepted
    assert stats.by_source["model"] == [stats.draft_proposed, stats.draft_accepted]
