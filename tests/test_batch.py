"""Batched speculation (engine/batch/engine.py): several requests decoded together, every row
exactly what the same request alone would be, on every cache type; one target pass per cycle for all
rows; rows that join late, end early, stop on a string or are cancelled."""

from __future__ import annotations

import pytest
import tiny
from losslesskit import PROMPTS, done_of, reference

from macspec.engine.batch.engine import BatchEngine
from macspec.engine.core.events import Cycle, Done, Prefill, Token
from macspec.engine.core.sampling import SamplingParams
from macspec.engine.drafters.lookup import HybridDrafter, LookupDrafter
from macspec.engine.drafters.model import ModelDrafter
from macspec.engine.generate.loop import Engine, GenerationConfig
from macspec.engine.policy.length import AutoPolicy, FixedPolicy

MAX_TOKENS = [14, 8, 16, 11]


def models(kind: str):
    if kind == "llama":
        target = tiny.random_model(0, scale=3.0)
        return target, tiny.noisy_copy(target, 0.05, seed=1)
    target = tiny.arch_model(kind, 0, scale=3.0)
    return target, tiny.noisy_arch_copy(target, 0.05, seed=1)


def drafting(source: str, draft):
    if source == "lookup":
        return lambda: LookupDrafter()
    if source == "hybrid":
        return lambda: HybridDrafter(ModelDrafter(draft))
    return lambda: ModelDrafter(draft)


def run_all(engine: BatchEngine, prompts, configs, step_between: bool = True):
    """Admit every request (prefilled in chunks, cycles of the others in between) and decode
    until all are done; their events by row."""
    rows = []
    for i, (prompt, config) in enumerate(zip(prompts, configs)):
        rows.append(engine.admit(prompt, config))
        while not engine.prefill_step(rows[-1], chunk=5):
            if step_between:
                engine.step()
        if step_between and i % 2:
            engine.step()
    while any(row.done is None for row in rows):
        engine.step()
    return rows


@pytest.mark.parametrize("kind", ["llama", "qwen3_5", "gemma3_text", "mamba2"])
@pytest.mark.parametrize("source", ["model", "lookup"])
def test_every_row_is_the_target_alone_greedy(tok, kind, source):
    target, draft = models(kind)
    prompts = [tok.encode(text) for text in PROMPTS[:4]]
    wants = [reference(target, p, m) for p, m in zip(prompts, MAX_TOKENS)]
    engine = BatchEngine(target, tok, drafting(source, draft), lambda d: FixedPolicy(3))
    configs = [GenerationConfig(max_tokens=m) for m in MAX_TOKENS]
    rows = run_all(engine, prompts, configs)
    for row, want in zip(rows, wants):
        assert row.done.tokens == want, f"{kind} {source}"
    if source == "model":  # a noisy copy of the target: most guesses kept
        assert any(row.done.stats.draft_accepted for row in rows)
        # Gated DeltaNet rows are rewound from the recorded pass: nothing is fed twice; a
        # Mamba row returns to before the pass and feeds its kept ids again.
        refed = sum(row.done.stats.refed_tokens for row in rows)
        assert (refed > 0) == (kind == "mamba2")
    assert max(row.done.stats.rows_per_pass for row in rows) > 1  # they did share passes


@pytest.mark.parametrize(
    "kind,source",
    [
        ("llama", "model"),
        ("gemma3_text", "model"),
        ("mamba2", "lookup"),
        ("mamba2", "model"),
        ("lfm2", "model"),
    ],
)
def test_a_one_id_prompt_joins_a_batch_as_itself_alone(tok, kind, source):
    """A prompt of one id (a single space) prefills nothing: its row joins the rows' caches
    empty (no keys yet; a recurrent state of zeros, as the model starts one), before, between
    and after rows that hold ids, and each row is still the target alone's."""
    target, draft = models(kind)
    one = tok.encode(" ")[-1:]
    prompts = [one, tok.encode(PROMPTS[0]), one]
    wants = [reference(target, p, 8) for p in prompts]
    engine = BatchEngine(target, tok, drafting(source, draft), lambda d: FixedPolicy(3))
    rows = run_all(engine, prompts, [GenerationConfig(max_tokens=8)] * 3)
    assert [row.done.tokens for row in rows] == wants


@pytest.mark.parametrize("kind", ["mamba2", "lfm2"])
@pytest.mark.parametrize("length", [1, 2])
def test_a_short_prompt_alone_rejects_back_to_its_first_state(tok, kind, length):
    """A recurrent row of one id, first in the batch or alone, holds no state yet (None) when
    its first guesses are rejected: it returns to zeros, as the model starts a state, not keeps
    what the pass fed it. Two ids: the prompt's first id made the state."""
    target, draft = models(kind)
    short = tok.encode(PROMPTS[1])[:length]
    for prompts in ([short], [short, tok.encode(PROMPTS[0])]):
        wants = [reference(target, p, 8) for p in prompts]
        engine = BatchEngine(target, tok, drafting("model", draft), lambda d: FixedPolicy(3))
        rows = run_all(engine, prompts, [GenerationConfig(max_tokens=8)] * len(prompts))
        assert [row.done.tokens for row in rows] == wants, f"{kind} {len(prompts)} rows"
        assert rows[0].done.stats.refed_tokens > 0  # a guess was rejected: the state returned


def seeded_alone(tok, target, prompts, max_tokens: int, first_seed: int):
    """Seeded configs (two sampling settings in turn, a seed each) and what the target alone
    samples for each prompt with its config."""
    settings = [SamplingParams(temperature=t, top_p=p) for t, p in [(0.7, 1.0), (1.0, 0.9)]]
    configs = [
        GenerationConfig(max_tokens=max_tokens, sampling=settings[i % 2], seed=first_seed + i)
        for i in range(len(prompts))
    ]
    wants = [done_of(Engine(target, tok).generate(p, c)).tokens for p, c in zip(prompts, configs)]
    return configs, wants


def test_seeded_rows_are_their_seeded_samples_alone(tok):
    """Each row samples with its own settings and seed; the coupled sampler keys its noise by
    seed and position, so a row is the same request alone, whatever drafts beside it."""
    target, draft = models("llama")
    prompts = [tok.encode(text) for text in PROMPTS[:4]]
    configs, wants = seeded_alone(tok, target, prompts, 12, first_seed=10)
    engine = BatchEngine(target, tok, drafting("hybrid", draft), lambda d: FixedPolicy(4))
    rows = run_all(engine, prompts, configs)
    assert [row.done.tokens for row in rows] == wants
    assert all(row.done.stats.sampler == "coupled" for row in rows)


def test_one_target_pass_per_cycle_for_all_rows(tok):
    target, draft = models("llama")
    prompts = [tok.encode(text) for text in PROMPTS[:3]]
    engine = BatchEngine(target, tok, drafting("model", draft), lambda d: FixedPolicy(2))
    rows = [engine.admit(p, GenerationConfig(max_tokens=30)) for p in prompts]
    for row in rows:
        while not engine.prefill_step(row):
            pass
    calls = []
    forward = type(target).__call__

    def counted(self, inputs, *args, **kwargs):
        if self is target:  # the draft is the same class: its steps are not counted
            calls.append(inputs.shape)
        return forward(self, inputs, *args, **kwargs)

    type(target).__call__ = counted
    try:
        for _ in range(3):
            engine.step()
    finally:
        type(target).__call__ = forward
    assert len(calls) == 3 and all(shape[0] == 3 for shape in calls)
    cycles = [e for row in rows for e in row.events if isinstance(e, Cycle)]
    assert len(cycles) == 9 and all(c.rows == 3 for c in cycles)


def test_rows_end_on_their_own_stops_eos_and_cancel(tok):
    target, draft = models("llama")
    prompts = [tok.encode(text) for text in PROMPTS[:3]]
    alone = [
        done_of(Engine(target, tok).generate(p, GenerationConfig(max_tokens=20))) for p in prompts
    ]
    stop = alone[1].text[3:5]
    configs = [
        GenerationConfig(max_tokens=20),
        GenerationConfig(max_tokens=20, stop_strings=(stop,)),
        GenerationConfig(max_tokens=20),
    ]
    engine = BatchEngine(target, tok, drafting("model", draft), lambda d: AutoPolicy())
    seen: list[int] = []
    rows = []
    for i, (prompt, config) in enumerate(zip(prompts, configs)):
        cancelled = (lambda: len(seen) >= 4) if i == 2 else None
        rows.append(engine.admit(prompt, config, cancelled))
        while not engine.prefill_step(rows[-1]):
            pass
    while any(row.done is None for row in rows):
        engine.step()
        seen[:] = [e.id for e in rows[2].events if isinstance(e, Token)]
    assert rows[0].done.tokens == alone[0].tokens
    assert rows[1].done.finish_reason == "stop_string"
    assert rows[1].done.text == alone[1].text[: alone[1].text.index(stop)]
    assert rows[2].done.finish_reason == "cancelled"
    assert rows[2].done.tokens == alone[2].tokens[: len(rows[2].done.tokens)]
    assert not engine.rows  # every finished row left the batch
    kinds = [type(e) for e in rows[0].events]
    assert kinds[0] is Prefill and kinds[-1] is Done


def test_a_row_cancelled_while_it_prefills_never_joins(tok):
    target, draft = models("llama")
    engine = BatchEngine(target, tok, drafting("model", draft), lambda d: FixedPolicy(2))
    prompt = tok.encode(PROMPTS[0] * 4)
    row = engine.admit(prompt, GenerationConfig(max_tokens=5))
    engine.prefill_step(row, chunk=4)
    engine.cancel(row)
    assert row.done.finish_reason == "cancelled" and not engine.joining and not engine.rows
    other = engine.admit(tok.encode(PROMPTS[1]), GenerationConfig(max_tokens=6))
    while not engine.prefill_step(other):
        pass
    while other.done is None:
        engine.step()
    assert other.done.tokens == reference(target, tok.encode(PROMPTS[1]), 6)


def test_a_finished_row_leaves_its_caches_for_the_next_turn(tok):
    target, draft = models("qwen3_5")
    prompt = tok.encode(PROMPTS[2])
    engine = BatchEngine(target, tok, drafting("model", draft), lambda d: FixedPolicy(3))
    (first,) = run_all(engine, [prompt], [GenerationConfig(max_tokens=8)])
    turn = prompt + first.done.tokens + tok.encode(" and then")
    (second,) = run_all(engine, [turn], [GenerationConfig(max_tokens=8)], step_between=False)
    again = engine.admit(turn, GenerationConfig(max_tokens=8), start_from=first.saved[0])
    prefill = again.events[0]
    assert isinstance(prefill, Prefill) and prefill.cached_tokens >= len(prompt) - 1
    while not engine.prefill_step(again):
        pass
    while again.done is None:
        engine.step()
    assert again.done.tokens == second.done.tokens == reference(target, turn, 8)


def acceptance_policy(rate: float) -> AutoPolicy:
    """An AutoPolicy that has measured acceptance `rate` at every position."""
    policy = AutoPolicy()
    for i in range(200):  # kept evenly: acceptance decays over recent cycles
        kept = int((i * rate) % 1 + rate >= 1)
        policy.observe(Cycle(4, 1, kept, 0.0, 0.0, 0.0, 1, 1, timed=False))
    assert abs(policy.acceptance(1) - rate) < 0.1
    return policy


@pytest.mark.parametrize(
    ("cost", "rows", "guesses"),
    [
        (lambda m: 0.001 * m, 4, "none"),  # a CPU: a pass over m ids costs m single passes
        (lambda m: 0.010 + 0.0001 * m, 2, "some"),  # a Mac's GPU with few rows: nearly free
        (lambda m: 0.010 + 0.0001 * max(0, m - 8) ** 2, 8, "fewer"),  # wide batches get dear
    ],
)
def test_the_batch_prices_guesses_on_its_pass_cost(cost, rows, guesses):
    from macspec.engine.batch.pricing import BatchPricing

    pricing = BatchPricing(probe_every=1000)
    for m in range(1, 80):
        pricing.observe(m, cost(m))
    policies = [acceptance_policy(0.8) for _ in range(rows)]
    ks = pricing.allocate(policies, [1] * rows, [8] * rows)
    if guesses == "none":
        assert ks == [0] * rows and pricing.plain
    else:
        assert sum(ks) > 0 and not pricing.plain
    if guesses == "fewer":
        few = BatchPricing(probe_every=1000)
        for m in range(1, 80):
            few.observe(m, cost(m))
        ks_two = few.allocate([acceptance_policy(0.8) for _ in range(2)], [1, 1], [8, 8])
        assert max(ks) < max(ks_two)  # more rows: each gets fewer guesses


@pytest.mark.parametrize("head", ["mtp", "dflash", "eagle3"])
def test_drafters_that_read_the_target_draft_in_a_batch(tok, tmp_path, head):
    """Each row's MTP head, DFlash drafter or EAGLE-3 head gets its own rows of the batched
    pass's hidden states; every row is still the target alone."""
    from macspec.engine.drafters.dflash import DFlashDrafter
    from macspec.engine.drafters.mtp import MTPDrafter
    from macspec.models.drafters import load_dflash, load_mtp

    if head == "mtp":
        target = tiny.near_bigram(tiny.arch_model("qwen3_5", 0, scale=3.0), mix=0.02)
        folder = tiny.save_mtp_folder(target, tmp_path, noise=0.005)
        weights = load_mtp(folder, tiny.CONFIGS[id(target)])

        def new_drafter():
            return MTPDrafter(weights, target)
    elif head == "eagle3":
        import eagle3kit
        from test_eagle3 import both_formats

        from macspec.engine.drafters.eagle3 import Eagle3Drafter

        target = eagle3kit.llama_target()
        weights = both_formats(target, tmp_path)[0]

        def new_drafter():
            return Eagle3Drafter(weights, target)
    else:
        target = tiny.arch_model("qwen3", 0, scale=3.0)
        folder = tiny.save_dflash_folder(tmp_path, target_layer_ids=(0, 1))
        weights = load_dflash(folder, tiny.CONFIGS[id(target)])

        def new_drafter():
            return DFlashDrafter(weights, target)

    prompts = [tok.encode(text) for text in PROMPTS[:3]]
    wants = [reference(target, p, 12) for p in prompts]
    engine = BatchEngine(target, tok, new_drafter, lambda d: FixedPolicy(3))
    rows = run_all(engine, prompts, [GenerationConfig(max_tokens=12)] * 3)
    assert [row.done.tokens for row in rows] == wants
    assert all(row.done.stats.draft_proposed for row in rows)
    if head != "dflash":  # heads made to agree: they keep guesses in the batch too
        assert all(row.done.stats.draft_accepted for row in rows)


def test_a_new_row_starts_from_the_figures_the_last_row_measured(tok):
    target, draft = models("llama")
    policy = lambda d: AutoPolicy(confidence_floor=0.0)  # noqa: E731
    engine = BatchEngine(target, tok, drafting("model", draft), policy)
    (first,) = run_all(engine, [tok.encode(PROMPTS[0])], [GenerationConfig(max_tokens=16)])
    learned = first.policy.acceptance(1)
    second = engine.admit(tok.encode(PROMPTS[1]), GenerationConfig(max_tokens=4))
    assert second.policy is not first.policy
    assert second.policy.acceptance(1) == learned != AutoPolicy().acceptance(1)
