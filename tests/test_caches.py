"""Speculation on the caches of 2026: hybrid (Gated DeltaNet + attention), sliding window,
pure recurrent. Greedy output is mlx-lm's target-only greedy, token for token; rollback leaves
every cache as a fresh prefill would; a rejection costs no extra target pass.

Tiny random models from mlx-lm's own classes (`tiny.arch_model`); the sliding window (12) is
shorter than prompt + answer, so the window wraps inside verify passes.
"""

from __future__ import annotations

import mlx.core as mx
import pytest
import tiny
from losslesskit import EOS, PROMPTS, done_of, reference
from mlx_lm.models.cache import ArraysCache, RotatingKVCache

from macspec.engine.caches.cached import CachedModel
from macspec.engine.drafters.lookup import HybridDrafter, LookupDrafter
from macspec.engine.drafters.model import ModelDrafter
from macspec.engine.drafters.protocol import Draft, Drafter
from macspec.engine.generate.loop import Engine, GenerationConfig
from macspec.engine.policy.length import AutoPolicy, FixedPolicy
from macspec.errors import MacspecError

MAX_TOKENS = 16


# target kind -> its drafts: name -> how to build it from the target
PAIRS = {
    "qwen3_5": {
        "hybrid draft": lambda t: tiny.noisy_arch_copy(t, 0.02, seed=1),
        "attention-only draft": lambda t: tiny.random_model(7, scale=3.0),
    },
    "gemma3_text": {"sliding draft": lambda t: tiny.noisy_arch_copy(t, 0.02, seed=1)},
    "mamba2": {"recurrent draft": lambda t: tiny.noisy_arch_copy(t, 0.02, seed=1)},
}
CONFIGS = ["k=1", "k=2", "k=4", "k=8", "auto", "lookup", "hybrid"]


@pytest.fixture(
    scope="module",
    params=[(t, d) for t, drafts in PAIRS.items() for d in drafts],
    ids=lambda p: f"{p[0]}, {p[1]}",
)
def pair(request):
    kind, draft_name = request.param
    target = tiny.arch_model(kind, 0, scale=3.0)
    return kind, target, PAIRS[kind][draft_name](target)


def make_engine(tok, target, draft, config: str) -> Engine:
    if config == "lookup":
        return Engine(target, tok, LookupDrafter(), FixedPolicy(4))
    if config == "hybrid":
        return Engine(target, tok, HybridDrafter(ModelDrafter(draft)), FixedPolicy(4))
    policy = AutoPolicy(confidence_floor=0.0) if config == "auto" else FixedPolicy(int(config[2:]))
    return Engine(target, tok, ModelDrafter(draft), policy)


def test_greedy_is_target_alone_for_every_draft_length_and_source(tok, pair):
    kind, target, draft = pair
    prompts = [tok.encode(text) for text in PROMPTS]
    expected = [reference(target, p, MAX_TOKENS) for p in prompts]
    assert any(len(p) + len(e) > 12 for p, e in zip(prompts, expected))  # past the window
    refed = 0
    for config in CONFIGS:
        engine = make_engine(tok, target, draft, config)  # one engine: caches reused throughout
        for prompt, want in zip(prompts, expected):
            done = done_of(engine.generate(prompt, GenerationConfig(max_tokens=MAX_TOKENS)))
            assert done.tokens == want, f"{kind} {config} {tok.decode(prompt)!r}"
            refed += done.stats.refed_tokens
    # Gated DeltaNet rewinds from the recorded pass and a window after a wide pass by cutting
    # its end: nothing is fed twice; Mamba restores its checkpoint and feeds the kept ids again.
    assert (refed > 0) == (kind == "mamba2")


# -- rollback, layer by layer ----------------------------------------------------------------
ARCHS = ["qwen3_5", "qwen3_5_moe", "gemma3_text", "mamba2", "lfm2"]


def fresh_logits(model, ids: list[int]) -> mx.array:
    cached = CachedModel(model)
    return cached.forward(ids)[-1]


def next_logits(cached: CachedModel, probe: int) -> mx.array:
    return cached.forward([probe])[-1]


@pytest.mark.parametrize("kind", ARCHS)
@pytest.mark.parametrize("rejected", [0, 1, 3])
def test_after_a_rollback_the_next_logits_equal_a_fresh_prefill(kind, rejected):
    model = tiny.arch_model(kind, 0, scale=3.0)
    prompt = list(range(30, 50))  # 20 ids: past the sliding window of 12
    cached = CachedModel(model)
    cached.prefill(prompt[:-1])
    cached.checkpoint()
    guesses = [7, 8, 9, 10]
    cached.forward([prompt[-1], *guesses])
    kept = len(guesses) - rejected
    held = cached.trim_to(len(prompt) + kept)
    committed = prompt + guesses[:kept]
    assert cached.tokens == committed[:held]
    got = cached.forward([*committed[held:], 99])[-1]  # the next pass feeds them again
    want = fresh_logits(model, [*committed, 99])
    assert mx.allclose(got, want, atol=1e-4).item()


def test_a_checkpoint_does_not_alias_a_sliding_window_written_in_place():
    """One-id steps write RotatingKVCache buffers in place (`keys[...] = k`); a checkpoint
    keeping the live array objects would see those writes, and the restore would be wrong."""
    model = tiny.arch_model("gemma3_text", 0, scale=3.0)
    prompt = list(range(30, 50))
    cached = CachedModel(model)
    cached.prefill(prompt)
    sliding = [c for c in cached.cache if isinstance(c, RotatingKVCache)]
    assert sliding and all(not c.is_trimmable() for c in sliding)  # the window has wrapped
    cached.checkpoint()
    before = [mx.array(c.keys) for c in sliding]
    for token in [5, 6, 7]:  # in-place writes, one id at a time
        mx.eval(cached.forward([token]))
    assert any(not mx.array_equal(c.keys, b).item() for c, b in zip(sliding, before))
    assert cached.trim_to(len(prompt)) == len(prompt)  # restored, nothing to feed again
    assert all(mx.array_equal(c.keys, b).item() for c, b in zip(sliding, before))
    got = next_logits(cached, 99)
    assert mx.allclose(got, fresh_logits(model, [*prompt, 99]), atol=1e-4).item()


def test_a_restored_checkpoint_can_be_restored_again():
    model = tiny.arch_model("qwen3_5", 0, scale=3.0)
    cached = CachedModel(model)
    cached.prefill(list(range(30, 40)))
    cached.checkpoint()
    for guesses in ([1, 2, 3], [4, 5]):
        cached.forward(guesses)
        assert cached.trim_to(10) == 10
    assert mx.allclose(
        next_logits(cached, 99), fresh_logits(model, [*range(30, 40), 99]), atol=1e-4
    )


def test_without_a_checkpoint_a_recurrent_cache_starts_over():
    model = tiny.arch_model("mamba2", 0)
    cached = CachedModel(model)
    cached.prefill(list(range(30, 40)))
    assert cached.trim_to(5) == 0
    assert cached.tokens == [] and all(isinstance(c, ArraysCache) for c in cached.cache)
    assert cached.reuse(list(range(30, 36))) == list(range(30, 36))


@pytest.mark.parametrize("kind", ["qwen3_5", "gemma3_text", "mamba2"])
def test_closing_mid_cycle_leaves_the_delivered_prefix(tok, kind):
    target = tiny.arch_model(kind, 0, scale=3.0)
    draft = tiny.noisy_arch_copy(target, 0.05, seed=2)
    prompt = tok.encode("The quick brown fox jumps over")
    for stop_after in (1, 3, 7):
        engine = Engine(target, tok, ModelDrafter(draft), FixedPolicy(4))
        events = engine.generate(prompt, GenerationConfig(max_tokens=MAX_TOKENS))
        delivered = []
        for event in events:
            if hasattr(event, "source"):
                delivered.append(event.id)
                if len(delivered) == stop_after:
                    break
        events.close()
        for cached in (engine.target, engine.drafter.state):
            committed = prompt + delivered
            assert cached.tokens == committed[: len(cached)]
            assert len(cached) >= len(prompt) - 1 or len(cached) == 0
            got = cached.forward([*committed[len(cached) :], 99])[-1]
            want = fresh_logits(cached.model, [*committed, 99])
            assert mx.allclose(got, want, atol=1e-4).item()


# -- a rejection costs no extra target pass ---------------------------------------------------
class ScriptedDrafter(Drafter):
    """Proposes the target's own greedy continuation with a wrong id at fixed positions, so
    two targets with the same outputs see exactly the same acceptance pattern."""

    name = "model"

    def __init__(self, continuation: list[int], prompt_len: int, wrong_every: int):
        self.continuation, self.prompt_len, self.wrong_every = continuation, prompt_len, wrong_every

    def start(self, prompt):
        pass

    def rollback(self, keep):
        pass

    def propose(self, context, k, params, key, confidence_floor):
        at = len(context) - self.prompt_len
        guesses = list(self.continuation[at : at + k])
        for i in range(len(guesses)):
            if (at + i) % self.wrong_every == self.wrong_every - 1:
                guesses[i] = (guesses[i] + 1) % tiny.VOCAB  # a wrong guess here
                break
        return Draft(tokens=guesses, steps=len(guesses), fed=len(guesses))


@pytest.mark.parametrize("wrong_every", [2, 3, 4])
def test_target_passes_per_token_match_an_attention_only_target(tok, wrong_every):
    prompt = tok.encode("Once upon a time")
    targets = {
        "qwen3_5": tiny.arch_model("qwen3_5", 0, scale=3.0),
        "llama": tiny.random_model(0, scale=3.0),
    }
    wants = {kind: reference(target, prompt, 40) for kind, target in targets.items()}
    n = min(len(want) for want in wants.values())  # the same length: the same pattern
    assert n >= 8
    passes = {}
    for kind, target in targets.items():
        drafter = ScriptedDrafter(wants[kind][:n] + [EOS] * 8, len(prompt), wrong_every)
        engine = Engine(target, tok, drafter, FixedPolicy(4))
        done = done_of(engine.generate(prompt, GenerationConfig(max_tokens=n)))
        assert done.tokens == wants[kind][:n]
        passes[kind] = (done.stats.target_passes, done.stats.draft_accepted)
        if kind == "qwen3_5":  # rewound inside the recorded pass: nothing fed twice
            assert done.stats.refed_tokens == 0 and engine.target.restores == 0
    assert passes["qwen3_5"] == passes["llama"]


def test_a_cache_that_cannot_be_checkpointed_is_refused_at_load(tok):
    class OpaqueCache:
        def __init__(self):
            self.handle = object()  # state outside anything we can copy

        def is_trimmable(self):
            return False

    target = tiny.arch_model("mamba2", 0)
    cache = [OpaqueCache() for _ in target.layers]
    with pytest.raises(MacspecError, match=r"draft model: its cache \(OpaqueCache\) cannot"):
        ModelDrafter(target, cache=cache)


# -- sampling on a hybrid pair ------------------------------------------------------------------
def test_sampling_on_a_hybrid_pair_has_the_targets_distribution(monkeypatch):
    """Three tokens sampled with k = 2: rejections rewind the Gated DeltaNet state inside the
    verify pass, and the joint distribution is still exactly the target's. The same harness
    with a wrong rule (resample from p on a rejection) fails the same bound."""
    from samplingkit import exact_joint, resample_from_p, sampled_joint
    from test_sampling import IdTokenizer, distribution_matches

    from macspec.engine.core.sampling import SamplingParams

    V = 5
    small = dict(hidden_size=32, num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    target = tiny.arch_model("qwen3_5", 11, scale=4.0, vocab=V, **small)
    draft = tiny.arch_model("qwen3_5", 12, scale=4.0, vocab=V, **small)
    params = SamplingParams(temperature=1.0)
    prompt = [1, 4, 2]
    exact = exact_joint(target, prompt, params, V)

    def engine():
        return Engine(target, IdTokenizer(), ModelDrafter(draft), FixedPolicy(2))

    outcomes, rejected = sampled_joint(engine(), prompt, params, V, 1200)
    assert rejected > 300  # the recurrent state was rolled back many times
    assert distribution_matches(outcomes, exact)
    monkeypatch.setattr("macspec.engine.generate.loop.sampled_verdict", resample_from_p)
    wrong, _ = sampled_joint(engine(), prompt, params, V, 1200)
    assert not distribution_matches(wrong, exact)


# -- a chat across turns: past the window, and with a history that changed ----------------------
@pytest.mark.parametrize("kind", ["qwen3_5", "gemma3_text"])
def test_a_chat_past_the_window_and_with_an_edited_answer_stays_exact(tok, tmp_path, kind):
    from macspec.chat.session import ChatSession
    from macspec.chat.store import Store

    target = tiny.arch_model(kind, 0, scale=3.0)
    draft = tiny.noisy_arch_copy(target, 0.02, seed=1)
    engine = Engine(target, tok, ModelDrafter(draft), FixedPolicy(3))
    config = GenerationConfig(max_tokens=MAX_TOKENS)
    chat = ChatSession(engine, tok, Store(tmp_path / "chats.db"), config=config)
    turns = ["hello there", "tell me more about it", "and then?", "one more time please"]
    for i, text in enumerate(turns):
        if i == 2:  # the user edited the last answer: the cache holds what was generated
            chat.messages[-1]["content"] = "something else entirely"
        done = done_of(chat.send(text))
        prompt = chat.last_prompt
        assert done.tokens == reference(target, prompt, MAX_TOKENS), f"turn {i + 1}"
        if i:
            assert done.stats.prefilled_tokens < len(prompt)  # a cached prefix was reused
    assert len(prompt) > 3 * 12  # the conversation is well past the sliding window


def test_restores_in_a_row_never_widen_a_pass_past_the_cap(tok):
    """Mamba with a draft that is always wrong: every cycle restores its checkpoint. The ids to
    feed again pile up to MAX_REFEED in a verify pass at most, then a plain step catches up."""
    from macspec.engine.core.cycle import Cycle
    from macspec.engine.generate.loop import MAX_REFEED

    target = tiny.arch_model("mamba2", 0, scale=3.0)
    draft = tiny.arch_model("mamba2", 5, scale=3.0)
    engine = Engine(target, tok, ModelDrafter(draft), FixedPolicy(2))
    prompt = tok.encode("Once upon a time")
    events = list(engine.generate(prompt, GenerationConfig(max_tokens=60)))
    cycles = [e for e in events if isinstance(e, Cycle)]
    assert done_of(events).tokens == reference(target, prompt, 60)
    assert max(c.refed for c in cycles if c.proposed) <= MAX_REFEED
    assert max(c.refed for c in cycles) <= MAX_REFEED + 2  # a catch-up: the last restore's too
    assert sum(c.refed for c in cycles) > MAX_REFEED  # restores did pile up, then caught up
    assert any(c.proposed == 0 and c.refed > 0 for c in cycles)  # the catch-up steps
