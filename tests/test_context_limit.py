"""The context window as a stop rule of the engine: the answer ends there ('context'), token
for token what target-only decoding gives, and a prompt that fills it is refused."""

from __future__ import annotations

import mlx.core as mx
import pytest
import tiny
from mlx_lm.generate import generate_step

from macspec.engine.drafters.model import ModelDrafter
from macspec.engine.generate.loop import Engine, GenerationConfig
from macspec.engine.policy.length import FixedPolicy
from macspec.errors import MacspecError

PROMPT = "1, 2, 3, 4,"


@pytest.fixture(scope="module")
def target():
    return tiny.random_model(0, scale=3.0)


def greedy_reference(model, prompt: list[int], max_tokens: int) -> list[int]:
    out = []
    for token, _ in generate_step(mx.array(prompt), model, max_tokens=max_tokens):
        if token == 257:  # the tiny tokenizer's end of sequence
            break
        out.append(token)
    return out


@pytest.mark.parametrize("room", [1, 3, 6])
def test_the_answer_stops_at_the_context_window(tok, target, room):
    prompt = tok.encode(PROMPT)
    expected = greedy_reference(target, prompt, room)
    engine = Engine(target, tok, ModelDrafter(target), FixedPolicy(4))
    config = GenerationConfig(max_tokens=10_000, context_length=len(prompt) + room)
    done = list(engine.generate(prompt, config))[-1]
    assert done.tokens == expected
    assert len(prompt) + len(done.tokens) <= config.context_length
    assert len(expected) == room  # no end of sequence first: the window ends it
    assert done.finish_reason == "context"


def test_max_tokens_below_the_window_is_still_length(tok, target):
    prompt = tok.encode(PROMPT)
    engine = Engine(target, tok, ModelDrafter(target), FixedPolicy(4))
    config = GenerationConfig(max_tokens=2, context_length=len(prompt) + 50)
    done = list(engine.generate(prompt, config))[-1]
    assert done.finish_reason in {"length", "stop"}
    assert done.finish_reason != "context"


def test_a_prompt_that_fills_the_window_is_refused(tok, target):
    prompt = tok.encode(PROMPT)
    engine = Engine(target, tok)
    config = GenerationConfig(context_length=len(prompt))
    with pytest.raises(MacspecError, match=f"the prompt is {len(prompt)} tokens"):
        list(engine.generate(prompt, config))


def test_within_context_cuts_max_tokens_only_when_the_window_comes_first():
    config = GenerationConfig(max_tokens=100, context_length=50)
    assert config.within_context(10) == (GenerationConfig(max_tokens=40, context_length=50), True)
    assert config.within_context(49)[0].max_tokens == 1
    assert GenerationConfig(max_tokens=5, context_length=50).within_context(10)[1] is False
    assert GenerationConfig(max_tokens=5).within_context(10**6)[1] is False
