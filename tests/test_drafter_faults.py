"""A drafter is only a guesser (engine/drafters/guard.py): an exception inside any of its calls
switches it off for the request, is logged once with its traceback, and the answer goes on,
token for token the target alone's, in the serial loop, under a grammar, in a tree cycle and
in a batch. The next request drafts again."""

from __future__ import annotations

import logging

import pytest
import tiny
from losslesskit import PROMPTS, done_of, reference

from macspec.engine.batch.engine import BatchEngine
from macspec.engine.core.config import GenerationConfig
from macspec.engine.core.grammar import Grammar
from macspec.engine.core.sampling import SamplingParams
from macspec.engine.core.taps import HiddenSpec
from macspec.engine.drafters.lookup import LookupDrafter
from macspec.engine.drafters.model import ModelDrafter
from macspec.engine.generate.loop import Engine
from macspec.engine.policy.length import FixedPolicy
from macspec.engine.trees.sizing import make_tree_policy

MAX_TOKENS = 24


class Faulty:
    """Wraps a drafter; its `method` raises at the `at`-th call (1-based) of this request."""

    def __init__(self, inner, method: str, at: int = 1):
        self.inner, self.method, self.at = inner, method, at
        self.name, self.calls = inner.name, 0
        self.needs = HiddenSpec(final=True)  # so that add_hidden is called too

    def _maybe_fail(self, method: str) -> None:
        if method == self.method:
            self.calls += 1
            if self.calls == self.at:
                raise IndexError(f"broken {method}")

    def start(self, prompt):
        self.calls = 0
        self._maybe_fail("start")
        self.inner.start(prompt)

    def propose(self, *args):
        self._maybe_fail("propose")
        return self.inner.propose(*args)

    def rollback(self, keep):
        self._maybe_fail("rollback")
        self.inner.rollback(keep)

    def add_hidden(self, start, hidden):
        self._maybe_fail("add_hidden")

    def caches(self):
        return self.inner.caches()

    def active(self):
        return self


@pytest.fixture(scope="module")
def fixture_models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tok")
    tiny.write_tokenizer(folder)
    target = tiny.random_model(0, scale=3.0)
    return tiny.tokenizer(folder), target, tiny.noisy_copy(target, 0.05, seed=1)


def engine_with(fixture_models, method: str, at: int, drafter: str = "model") -> Engine:
    tok, target, draft = fixture_models
    inner = ModelDrafter(draft) if drafter == "model" else LookupDrafter()
    return Engine(target, tok, Faulty(inner, method, at), FixedPolicy(4))


@pytest.mark.parametrize(
    "method,at", [("start", 1), ("propose", 1), ("propose", 3), ("rollback", 2), ("add_hidden", 2)]
)
def test_a_failing_drafter_is_switched_off_and_the_answer_is_the_targets(
    fixture_models, caplog, method, at
):
    tok, target, _ = fixture_models
    engine = engine_with(fixture_models, method, at)
    prompt = tok.encode(PROMPTS[0])
    with caplog.at_level(logging.WARNING, logger="macspec.engine"):
        done = done_of(engine.generate(prompt, GenerationConfig(max_tokens=MAX_TOKENS)))
    assert done.tokens == reference(target, prompt, MAX_TOKENS)
    reason = done.stats.plain_reason
    assert "model drafter switched off" in reason and f"IndexError: broken {method}" in reason
    warnings = [r for r in caplog.records if "switched off" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].exc_info is not None  # once, with the traceback
    assert done.stats.to_dict()["plain_reason"] == reason
    # The next request gets its drafter back, and drafts.
    engine.drafter.at = 0  # never again
    done = done_of(engine.generate(prompt, GenerationConfig(max_tokens=MAX_TOKENS)))
    assert done.tokens == reference(target, prompt, MAX_TOKENS)
    assert done.stats.draft_proposed > 0 and not done.stats.plain_reason


def test_seeded_sampling_survives_a_failing_drafter(fixture_models):
    tok, target, _ = fixture_models
    prompt = tok.encode(PROMPTS[2])
    config = GenerationConfig(max_tokens=MAX_TOKENS, sampling=SamplingParams(0.8), seed=3)
    plain = done_of(Engine(target, tok).generate(prompt, config))
    done = done_of(engine_with(fixture_models, "propose", 2).generate(prompt, config))
    assert done.tokens == plain.tokens and "switched off" in done.stats.plain_reason


def test_a_failing_drafter_under_a_grammar(fixture_models):
    tok, target, _ = fixture_models
    prompt = tok.encode(PROMPTS[3])
    config = GenerationConfig(max_tokens=16, grammar=tiny_grammar())
    plain = done_of(Engine(target, tok).generate(prompt, config))
    for method in ("propose", "rollback"):
        done = done_of(engine_with(fixture_models, method, 2, "lookup").generate(prompt, config))
        assert done.tokens == plain.tokens
        assert "lookup drafter switched off" in done.stats.plain_reason


def tiny_grammar() -> Grammar:
    return Grammar("regex", "[a-z ]{0,40}")


class FaultyTreeDrafter(ModelDrafter):
    """A draft model that grows trees and fails after its second tree: in its model's forward
    pass (while it grows a tree), or in `rollback`."""

    def __init__(self, draft, method: str):
        super().__init__(draft)
        self.method, self.rollbacks = method, 0

    def rollback(self, keep: int) -> None:
        self.rollbacks += 1
        if self.method == "rollback" and self.rollbacks == 3:
            raise IndexError("broken rollback")
        super().rollback(keep)


@pytest.mark.parametrize("method", ["forward", "rollback"])
def test_a_failing_drafter_in_a_tree_cycle(fixture_models, monkeypatch, method):
    tok, target, draft = fixture_models
    prompt = tok.encode(PROMPTS[5])
    drafter = FaultyTreeDrafter(draft, method)
    forward = type(draft).__call__

    def failing(self, *args, **kwargs):
        if self is draft and method == "forward" and drafter.rollbacks >= 2:
            raise IndexError("broken forward")
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(type(draft), "__call__", failing)
    engine = Engine(target, tok, drafter, make_tree_policy("8", FixedPolicy(3)))
    done = done_of(engine.generate(prompt, GenerationConfig(max_tokens=MAX_TOKENS)))
    assert done.tokens == reference(target, prompt, MAX_TOKENS)
    assert done.stats.tree_cycles > 0 and "switched off" in done.stats.plain_reason


@pytest.mark.parametrize("method", ["start", "propose", "rollback", "add_hidden"])
def test_a_failing_drafter_in_a_batch_fails_only_its_own_row(fixture_models, method):
    tok, target, draft = fixture_models
    prompts = [tok.encode(text) for text in PROMPTS[:3]]
    wants = [reference(target, p, MAX_TOKENS) for p in prompts]
    made = []

    def new_drafter():  # the engine's own first, then a row's each: the second row's fails
        at = 1 if method == "start" else 2
        made.append(Faulty(ModelDrafter(draft), method if len(made) == 2 else "none", at))
        return made[-1]

    engine = BatchEngine(target, tok, new_drafter, lambda d: FixedPolicy(3))
    rows = []
    for prompt in prompts:
        rows.append(engine.admit(prompt, GenerationConfig(max_tokens=MAX_TOKENS)))
        while not engine.prefill_step(rows[-1]):
            pass
    while any(row.done is None for row in rows):
        engine.step()
    assert [row.done.tokens for row in rows] == wants
    reasons = [row.done.stats.plain_reason for row in rows]
    assert "switched off" in (reasons[1] or "") and f"in {method}" in reasons[1]
    assert not reasons[0] and not reasons[2]
    assert rows[0].done.stats.draft_proposed and rows[2].done.stats.draft_proposed
