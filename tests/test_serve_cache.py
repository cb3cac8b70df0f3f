"""The server's prompt cache on every cache type: conversations that take turns still get the
target's own greedy answers, and a conversation that comes back prefills only its new ids."""

from __future__ import annotations

import losslesskit
import mlx.core as mx
import pytest
import tiny

from macspec.engine.caches.cached import CachedModel
from macspec.engine.drafters.lookup import HybridDrafter
from macspec.engine.drafters.model import ModelDrafter
from macspec.engine.generate.loop import Engine, GenerationConfig
from macspec.engine.policy.length import FixedPolicy
from macspec.serve.prompt_cache import PromptCache, shared_prefix

MAX_TOKENS = 10


def reference(model, prompt: list[int]) -> list[int]:
    """mlx-lm greedy decoding of the target alone, cut at (and without) EOS."""
    return losslesskit.reference(model, prompt, MAX_TOKENS)


def build(kind: str):
    if kind == "llama":
        target = tiny.random_model(0, scale=3.0)
        return target, tiny.noisy_copy(target, 0.02, seed=1)
    target = tiny.arch_model(kind, 0, scale=3.0)
    return target, tiny.noisy_arch_copy(target, 0.02, seed=1)


@pytest.mark.parametrize("kind", ["llama", "qwen3_5", "gemma3_text", "mamba2"])
def test_conversations_taking_turns_stay_lossless_and_reuse_their_prefix(tok, kind):
    target, draft = build(kind)
    engine = Engine(target, tok, HybridDrafter(ModelDrafter(draft)), FixedPolicy(3))
    assert len(engine.cached_models()) == 2  # the target's and the hybrid's draft model's
    cache = PromptCache(engine, size=2)
    names = ["alpha says hello", "beta asks a question", "gamma writes code"]
    history = {name: tok.encode(name) for name in names}
    for turn in range(3):
        for name in names:
            if turn:  # the conversation grows: its last answer and a new message
                history[name] = history[name] + tok.encode(f" then {turn}")
            prompt = history[name]
            cache.prepare(prompt)
            held = list(engine.target.tokens)
            done = list(engine.generate(prompt, GenerationConfig(MAX_TOKENS)))[-1]
            assert done.tokens == reference(target, prompt), f"{kind} {name} turn {turn}"
            if turn:
                # Its own state came back (from the saved ones): only the new ids are fed,
                # or, for a model that cannot trim, those after its prompt checkpoint.
                new = len(tok.encode(f" then {turn}")) + 1  # and the last answer id, not fed
                assert shared_prefix(held, prompt) >= len(prompt) - new
                assert done.stats.prefilled_tokens <= len(prompt) - shared_prefix(held, prompt) + 1
            history[name] = prompt + done.tokens
    assert cache.hits >= 4 and len(cache.entries) <= 2


def test_a_saved_state_is_unchanged_by_what_the_live_cache_does_next(tok):
    target = tiny.random_model(0, scale=3.0)
    model = CachedModel(target)
    model.prefill(tok.encode("the first conversation"))
    saved = model.save()
    logits_then = model.forward(tok.encode(" goes on"))[-1]
    mx.eval(logits_then)
    model.trim_to(3)
    model.prefill(tok.encode("something else entirely, much longer than before"))
    model.load(saved)
    assert model.tokens == list(saved.tokens)
    again = model.forward(tok.encode(" goes on"))[-1]
    assert mx.allclose(again, logits_then).item()
    model.load(saved)  # a state loads again after use
    assert len(model) == len(saved.tokens)


def test_the_lru_keeps_the_most_recent_and_drops_prefixes(tok):
    target = tiny.random_model(0, scale=3.0)
    engine = Engine(target, tok)
    cache = PromptCache(engine, size=2)
    for text in ["one one one", "two two two", "three three", "four four"]:
        prompt = tok.encode(text)
        cache.prepare(prompt)
        list(engine.generate(prompt, GenerationConfig(4)))
    assert len(cache.entries) == 2
    assert [tok.decode(list(k))[:5] for k in cache.entries] == ["two t", "three"]
    # The same prompt again (a regenerated answer): its state is saved once, not twice.
    again = tok.encode("two two two")
    for _ in range(2):
        cache.prepare(again)
        list(engine.generate(again, GenerationConfig(4)))
    cache.prepare(tok.encode("five"))
    assert sum(k[: len(again)] == tuple(again) for k in cache.entries) == 1
