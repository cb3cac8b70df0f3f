"""At most one blocking host-device wait per speculative cycle.

On an Apple GPU the CPU builds the next step's graph while the GPU runs the current one, unless
the code waits for a result; every such wait leaves the GPU idle. A wait is counted when the
code reads an array (`mx.eval`, `.item()`, `.tolist()`) after a forward pass was queued and
before anything else was read: that read waits on the pass. `mx.async_eval` never waits.
Reads of arrays already computed are free and not counted.

The engine reads each cycle's guesses and verdict together, once. A probe cycle now and then
(`timed`) also waits after drafting, to time drafting and verifying apart for the policy.
"""

from __future__ import annotations

import pytest
import tiny

from macspec.bench.waits import WaitCounter
from macspec.engine.core.cycle import Cycle
from macspec.engine.core.events import Done, Token
from macspec.engine.core.sampling import SamplingParams
from macspec.engine.drafters.lookup import HybridDrafter, LookupDrafter
from macspec.engine.drafters.model import ModelDrafter
from macspec.engine.generate.loop import PROBE_EVERY, Engine, GenerationConfig
from macspec.engine.policy.length import AutoPolicy, FixedPolicy


def waits_per_cycle(engine: Engine, prompt: list[int], config, waits: WaitCounter):
    """[(cycle, waits since the previous cycle's record)] over one generation."""
    out, before = [], None
    for event in engine.generate(prompt, config):
        if isinstance(event, Cycle):
            if before is not None:
                out.append((event, waits.count - before))
            before = waits.count
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tok")
    tiny.write_tokenizer(folder)
    target = tiny.random_model(0, scale=3.0)
    # A near copy: sure of itself, so `auto`'s confidence floor is not what cuts its drafts.
    return tiny.tokenizer(folder), target, tiny.noisy_copy(target, 0.005, seed=1)


DRAFTERS = {
    "model": lambda draft: ModelDrafter(draft),
    "lookup": lambda draft: LookupDrafter(),
    "hybrid": lambda draft: HybridDrafter(ModelDrafter(draft)),
}
POLICIES = {
    "k=1": lambda: FixedPolicy(1),
    "k=2": lambda: FixedPolicy(2),
    "k=4": lambda: FixedPolicy(4),
    "k=8": lambda: FixedPolicy(8),
    # probes and plain stretches aside, `auto` drafts like a fixed k; never plain for good
    "auto": lambda: AutoPolicy(start_k=4, probe_every=10_000, confidence_floor=0.05),
}


@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("source", list(DRAFTERS))
def test_one_wait_per_cycle(models, monkeypatch, source, policy, temperature):
    tok, target, draft = models
    # An Apple GPU's cost curve (a pass over a few ids costs about one): `auto` keeps drafting.
    monkeypatch.setattr(AutoPolicy, "pass_time", lambda self, m: 1.0)
    engine = Engine(target, tok, DRAFTERS[source](draft), POLICIES[policy]())
    prompt = tok.encode("the cat sat on the mat. the cat sat on the mat. the")
    config = GenerationConfig(
        max_tokens=48, sampling=SamplingParams(temperature=temperature), seed=1
    )
    # The bench's own counter (bench/waits.py), so what is asserted here is what it reports.
    with WaitCounter([target, draft]) as waits:
        cycles = waits_per_cycle(engine, prompt, config, waits)
    spec = [(c, w) for c, w in cycles if c.proposed]
    assert spec, [(c.requested, c.proposed, c.timed) for c, _ in cycles]
    # Every cycle waits once, but a probe, which also waits after drafting.
    assert all(w <= (2 if c.timed and c.requested else 1) for c, w in cycles), [
        (c.proposed, c.timed, w) for c, w in cycles
    ]
    untimed = [w for c, w in spec if not c.timed]
    assert untimed and max(untimed) == 1
    probes = sum(c.timed for c, _ in spec)
    assert probes <= 4 + len(spec) // PROBE_EVERY + 1
    if policy.startswith("k="):  # a fixed k prices nothing: no probe, one wait every cycle
        assert probes == 0 and all(w == 1 for c, w in cycles if c.requested)


def test_auto_times_its_choices_on_probe_cycles_only(models, monkeypatch):
    """The policy learns pass times from probes and plain steps; other cycles give it
    acceptance only, so no cycle needs a wait of its own for the policy."""
    tok, target, draft = models
    monkeypatch.setattr(AutoPolicy, "pass_time", lambda self, m: 1.0)  # it keeps drafting
    policy = AutoPolicy(start_k=3, probe_every=10_000)
    seen = []
    observe = policy._observe_times
    monkeypatch.setattr(policy, "_observe_times", lambda c: seen.append(c) or observe(c))
    engine = Engine(target, tok, ModelDrafter(draft), policy)
    events = list(engine.generate(tok.encode("hello there"), GenerationConfig(max_tokens=64)))
    cycles = [e for e in events if isinstance(e, Cycle)]
    assert seen == [c for c in cycles if c.timed]
    assert any(not c.timed for c in cycles)


def test_the_next_draft_is_queued_before_a_cycles_tokens_are_handed_over(models):
    """The device drafts the next cycle while the consumer turns this cycle's tokens into
    text; nothing is drafted past the end of the answer."""
    tok, target, draft = models
    drafter = ModelDrafter(draft)
    proposals = []
    propose = drafter.propose
    drafter.propose = lambda *args: proposals.append(len(args[0])) or propose(*args)
    engine = Engine(target, tok, drafter, FixedPolicy(3))
    speculative, ahead = 0, []
    for event in engine.generate(tok.encode("hello there"), GenerationConfig(max_tokens=40)):
        if isinstance(event, Cycle) and event.draft_steps:
            speculative += 1
        elif isinstance(event, Token):
            ahead.append(len(proposals) - speculative)
        elif isinstance(event, Done):
            done = event
    assert done.finish_reason == "length" and speculative > 5
    assert len(proposals) == speculative  # every draft was verified
    # While a cycle's tokens are handed over, the next draft is queued, but at the end.
    assert ahead.count(1) >= len(ahead) - 4 and ahead[-1] == 0


@pytest.mark.parametrize("source", ["model", "hybrid"])
def test_auto_waits_about_once_per_cycle(models, monkeypatch, source):
    """`auto` as shipped (probes and all) waits at most 1.10 times per cycle over whole
    answers: a probe's extra wait is rare, since every cycle's whole time teaches the policy
    the target's passes."""
    tok, target, draft = models
    monkeypatch.setattr(AutoPolicy, "pass_time", lambda self, m: 1.0)  # it keeps drafting
    total_waits = total_cycles = 0
    for seed, text in enumerate(["the cat sat on the mat. the cat", "hello there, the dog and"]):
        engine = Engine(target, tok, DRAFTERS[source](draft), AutoPolicy())
        config = GenerationConfig(max_tokens=64, sampling=SamplingParams(0.8), seed=seed)
        with WaitCounter([target, draft]) as waits:
            cycles = waits_per_cycle(engine, tok.encode(text), config, waits)
        total_waits += sum(w for _, w in cycles)
        total_cycles += len(cycles)
    assert total_cycles > 20
    assert total_waits / total_cycles <= 1.10, (total_waits, total_cycles)
