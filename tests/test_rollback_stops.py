"""Caches after rejections and early exits, and every stop rule, against target-only decoding."""

from __future__ import annotations

import mlx.core as mx
import pytest
import tiny
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import make_prompt_cache

from macspec.engine.caches.cached import CachedModel
from macspec.engine.core.events import Cycle, Token
from macspec.engine.drafters.model import ModelDrafter
from macspec.engine.generate.loop import Engine, GenerationConfig
from macspec.engine.policy.length import FixedPolicy

PROMPTS = ["hello world", "def f(x):", "The quick brown fox", "1, 2, 3, 4,", "Once upon a time"]


@pytest.fixture(scope="module")
def tok_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tok")
    tiny.write_tokenizer(folder)
    return folder


@pytest.fixture(scope="module")
def tok(tok_folder):
    return tiny.tokenizer(tok_folder)


@pytest.fixture(scope="module")
def target():
    return tiny.random_model(0, scale=3.0)


@pytest.fixture(scope="module")
def draft(target):
    return tiny.noisy_copy(target, 0.03, seed=5)


def greedy_reference(model, prompt, max_tokens, eos=frozenset({257})):
    out = []
    for token, _ in generate_step(mx.array(prompt), model, max_tokens=max_tokens):
        if token in eos:
            break
        out.append(token)
    return out


def fresh_logits(model, tokens: list[int]) -> mx.array:
    """Next-token logits after a prefill from scratch."""
    cache = make_prompt_cache(model)
    logits = model(mx.array(tokens)[None], cache=cache)[0, -1]
    return logits


def assert_cache_is_its_tokens(state: CachedModel):
    """The trimmed cache predicts exactly what a fresh prefill of its tokens predicts."""
    assert all(c.offset == len(state.tokens) for c in state.cache)
    probe = 42
    logits = state.model(mx.array([probe])[None], cache=state.cache)[0, -1]
    state.trim_to(len(state.tokens))  # the probe went in behind forward's back: drop it
    assert all(c.offset == len(state.tokens) for c in state.cache)
    expected = fresh_logits(state.model, state.tokens + [probe])
    assert mx.allclose(logits, expected, atol=1e-4).item()


def test_caches_hold_the_accepted_prefix_after_every_cycle(tok, target, draft):
    engine = Engine(target, tok, ModelDrafter(draft), FixedPolicy(4))
    prompt = tok.encode(PROMPTS[0])
    delivered: list[int] = []
    rejections = checked = 0
    remaining_in_cycle = 0
    for event in engine.generate(prompt, GenerationConfig(max_tokens=40)):
        if isinstance(event, Cycle):
            rejections += event.accepted < event.proposed
            remaining_in_cycle = event.accepted + 1
        elif isinstance(event, Token):
            delivered.append(event.id)
            remaining_in_cycle -= 1
            if remaining_in_cycle == 0:  # the cycle is fully delivered: check both caches
                sequence = prompt + delivered
                assert engine.target.tokens == sequence[:-1]
                # The draft holds the sequence but for its last two ids at most, then the next
                # cycle's guesses, drafted while these tokens were delivered (all but the last
                # guess are fed to it).
                draft_tokens = engine.drafter.state.tokens
                shared = next(
                    (i for i, (a, b) in enumerate(zip(draft_tokens, sequence)) if a != b),
                    min(len(draft_tokens), len(sequence)),
                )
                assert shared >= len(sequence) - 2
                assert len(draft_tokens) - shared <= 4 - 1
                checked += 1
    assert rejections > 0 and checked > 3
    assert_cache_is_its_tokens(engine.target)
    assert_cache_is_its_tokens(engine.drafter.state)


def consume_then_close(engine: Engine, prompt: list[int], stop_after: int) -> list[int]:
    """Read `stop_after` tokens, then close the generator as a UI cancel would."""
    seen = []
    gen = engine.generate(prompt, GenerationConfig(max_tokens=40))
    for event in gen:
        if isinstance(event, Token):
            seen.append(event.id)
            if len(seen) == stop_after:
                break
    gen.close()
    return seen


@pytest.mark.parametrize("stop_after", [1, 3, 7, 12])
def test_closing_the_generator_mid_run_leaves_consistent_caches(tok, target, draft, stop_after):
    engine = Engine(target, tok, ModelDrafter(draft), FixedPolicy(4))
    prompt = tok.encode(PROMPTS[1])
    consumed = prompt + consume_then_close(engine, prompt, stop_after)
    assert engine.target.tokens == consumed[:-1]
    assert engine.drafter.state.tokens == consumed[: len(engine.drafter.state.tokens)]
    assert len(engine.drafter.state.tokens) <= len(consumed) - 1
    assert_cache_is_its_tokens(engine.target)
    assert_cache_is_its_tokens(engine.drafter.state)
    # And the next generation from there is still exactly the target's.
    done = list(engine.generate(consumed, GenerationConfig(max_tokens=10)))[-1]
    assert done.tokens == greedy_reference(target, consumed, 10)


@pytest.mark.parametrize("stop_after", [1, 4, 9])
@pytest.mark.parametrize("with_auto_draft", [False, True])
def test_closing_mid_plain_stretch_drops_the_prefetched_step(
    tok, target, draft, stop_after, with_auto_draft
):
    """Plain steps are pipelined (the next one is queued early); closing must undo that."""
    from macspec.engine.policy.length import AutoPolicy

    engine = (
        Engine(target, tok, ModelDrafter(draft), AutoPolicy())
        if with_auto_draft
        else Engine(target, tok)
    )
    prompt = tok.encode(PROMPTS[2])
    consumed = prompt + consume_then_close(engine, prompt, stop_after)
    assert engine.target.tokens == consumed[:-1]
    assert_cache_is_its_tokens(engine.target)
    done = list(engine.generate(consumed, GenerationConfig(max_tokens=10)))[-1]
    assert done.tokens == greedy_reference(target, consumed, 10)


def test_interrupted_forward_pass_is_rolled_back_per_layer(target):
    """Ctrl-C between layers leaves layers at different lengths; trim_to evens them."""
    state = CachedModel(target)
    state.prefill([1, 2, 3, 4, 5])
    state.cache[0].offset += 3  # as if layer 0 took three more ids before the interrupt
    state.trim_to(len(state.tokens))
    assert [c.offset for c in state.cache] == [5] * len(state.cache)
    assert_cache_is_its_tokens(state)


@pytest.mark.parametrize("k", [1, 4])
def test_eos_inside_an_accepted_draft_run(tok_folder, target, k):
    """Treat a token the target emits mid-run as EOS: output stops right before it."""
    base = tiny.tokenizer(tok_folder)
    prompt = base.encode(PROMPTS[2])
    plain = greedy_reference(target, prompt, 30)
    checked = 0
    for position in range(2, 14):
        eos = plain[position]
        if eos in plain[:position]:
            continue
        tok = tiny.tokenizer(tok_folder)
        tok.add_eos_token(str(eos))
        # The target drafting for itself accepts everything, so EOS lands inside a run.
        engine = Engine(target, tok, ModelDrafter(target), FixedPolicy(k))
        done = list(engine.generate(prompt, GenerationConfig(max_tokens=30)))[-1]
        assert done.tokens == plain[:position]
        assert done.finish_reason == "stop"
        plain_engine = Engine(target, tok)
        assert (
            list(plain_engine.generate(prompt, GenerationConfig(max_tokens=30)))[-1].tokens
            == plain[:position]
        )
        checked += 1
    assert checked >= 5


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 5, 8, 13])
def test_max_tokens_inside_a_draft_run(tok, target, max_tokens):
    prompt = tok.encode(PROMPTS[3])
    expected = greedy_reference(target, prompt, max_tokens)
    engine = Engine(target, tok, ModelDrafter(target), FixedPolicy(4))
    done = list(engine.generate(prompt, GenerationConfig(max_tokens=max_tokens)))[-1]
    assert done.tokens == expected
    assert len(done.tokens) <= max_tokens
    assert (
        done.stats.draft_proposed + done.stats.target_passes
        <= max_tokens + done.stats.target_passes
    )


def streamed_text(events) -> str:
    return "".join(e.text for e in events if isinstance(e, Token)) + events[-1].tail


@pytest.mark.parametrize("prompt_text", PROMPTS[:3])
def test_stop_strings_inside_a_draft_run(tok, target, prompt_text):
    prompt = tok.encode(prompt_text)
    plain = Engine(target, tok)
    full = list(plain.generate(prompt, GenerationConfig(max_tokens=30)))[-1].text
    printable = [i for i in range(3, len(full) - 3) if full[i : i + 2].isprintable()]
    assert printable, "need some printable text to pick stop strings from"
    for start in printable[:4]:
        stop = full[start : start + 2]
        expected = full[: full.find(stop)]
        for engine in (
            Engine(target, tok, ModelDrafter(target), FixedPolicy(4)),
            Engine(target, tok),
        ):
            events = list(
                engine.generate(prompt, GenerationConfig(max_tokens=30, stop_strings=(stop,)))
            )
            done = events[-1]
            assert done.finish_reason == "stop_string"
            assert done.text == expected
            assert streamed_text(events) == expected  # nothing of the stop string leaked out


def test_text_is_held_back_only_while_it_may_begin_a_stop_string(tok, target):
    prompt = tok.encode(PROMPTS[4])
    events = list(
        Engine(target, tok).generate(
            prompt, GenerationConfig(max_tokens=20, stop_strings=("\x00never",))
        )
    )
    assert events[-1].finish_reason == "length"
    assert streamed_text(events) == events[-1].text


def test_cancel_ends_with_a_done_and_consistent_caches(tok, target, draft):
    engine = Engine(target, tok, ModelDrafter(draft), FixedPolicy(3))
    prompt = tok.encode(PROMPTS[0])
    count = {"n": 0}

    def cancelled():
        count["n"] += 1
        return count["n"] >= 5

    events = list(engine.generate(prompt, GenerationConfig(max_tokens=40), cancelled=cancelled))
    done = events[-1]
    assert done.finish_reason == "cancelled"
    assert len(done.tokens) == 5
    assert engine.target.tokens == (prompt + done.tokens)[:-1]
    assert_cache_is_its_tokens(engine.drafter.state)
