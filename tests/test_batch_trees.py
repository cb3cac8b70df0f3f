"""Draft trees in a batch (engine/batch/tree.py): rows with trees of different sizes, chain rows
and rows under a grammar share one target pass, and every row is exactly what the same request
alone produces (mlx-lm's greedy decoding; plain decoding's seeded samples), on full attention,
sliding windows and Gated DeltaNet layers (one state per branch); other recurrent targets verify
chains and say so; a drafter that fails while growing a tree is switched off for its row only;
`macspec serve --max-batch 4 --draft-tree 8` serves trees in shared passes."""

from __future__ import annotations

import itertools
import random
from types import SimpleNamespace

import mlx.core as mx
import pytest
import tiny
from losslesskit import PROMPTS, done_of, reference
from mlx_lm.models.cache import KVCache
from test_batch import models, run_all, seeded_alone
from treekit import OracleBlock, mtp_head

from macspec.engine.batch.engine import BatchEngine
from macspec.engine.batch.tree import RECURRENT_NOTE
from macspec.engine.core.cycle import TreeOutcome
from macspec.engine.core.events import Cycle
from macspec.engine.core.grammar import Grammar
from macspec.engine.core.sampling import SamplingParams
from macspec.engine.drafters.model import ModelDrafter
from macspec.engine.drafters.mtp import MTPDrafter
from macspec.engine.generate.loop import Engine, GenerationConfig
from macspec.engine.policy.length import FixedPolicy
from macspec.engine.trees.ranks import RankStats
from macspec.engine.trees.sizing import TreePolicy, make_tree_policy
from macspec.models.drafters import load_dflash

MAX_TOKENS = [14, 9, 16, 12, 10]
SIZES = ["8", "4", "off", "16", "auto"]
"""Each row's --draft-tree, in the order rows join: trees of three sizes, a chain row, and a
row whose tree size the batch prices on its passes."""


def draft_model(draft) -> ModelDrafter:
    """The draft model with plain attention caches (a sliding window kept by the mask alone):
    its own trees branch, whatever the target's caches."""
    return ModelDrafter(draft, cache=[KVCache() for _ in draft.layers])


def tree_engine(tok, target, draft, sizes=SIZES, k=3, drafter=draft_model) -> BatchEngine:
    """Rows drafting with the draft model, each row's tree size the next of `sizes`."""
    turns = itertools.chain(["8"], itertools.cycle(sizes))  # the engine's probe takes the first
    return BatchEngine(
        target,
        tok,
        lambda: drafter(draft),
        lambda d: make_tree_policy(next(turns), FixedPolicy(k)),
    )


def tree_cycles(row) -> list[Cycle]:
    return [e for e in row.events if isinstance(e, Cycle) and e.tree is not None]


@pytest.mark.parametrize("kind", ["llama", "gemma3_text"])
def test_rows_with_trees_of_their_own_sizes_are_the_target_alone(tok, kind):
    target, draft = models(kind)
    prompts = [tok.encode(text) for text in PROMPTS[:5]]
    wants = [reference(target, p, m) for p, m in zip(prompts, MAX_TOKENS)]
    engine = tree_engine(tok, target, draft)
    assert engine.trees and engine.batch_draft is None  # each row grows its own tree
    rows = run_all(engine, prompts, [GenerationConfig(max_tokens=m) for m in MAX_TOKENS])
    for row, want in zip(rows, wants):
        assert row.done.tokens == want, kind
    sized = {row.done.stats.tree_nodes / row.done.stats.tree_cycles for row in rows[:2]}
    assert all(row.done.stats.tree_cycles > 0 for row in (rows[0], rows[1], rows[3]))
    assert len(sized) == 2  # the 8-node and the 4-node rows grew trees of their own sizes
    assert rows[2].done.stats.tree_cycles == 0 and rows[2].done.stats.draft_proposed
    assert all(row.done.stats.tree_note is None for row in rows)
    shared = [c for row in rows for c in tree_cycles(row) if c.rows > 1]
    assert shared and any(c.accepted for c in shared)  # trees in shared passes, guesses kept
    assert max(row.done.stats.rows_per_pass for row in rows) > 1


def test_one_wait_per_batched_step_with_trees(tok):
    """Every row's tree is grown and verified, and every verdict read, with one host-device
    wait per batched step (the cycle's one read, for all rows)."""
    from macspec.bench.waits import WaitCounter

    target, draft = models("llama")
    prompts = [tok.encode(text) for text in PROMPTS[:3]]
    engine = tree_engine(tok, target, draft, ["8", "4", "16"])
    seeded = GenerationConfig(max_tokens=16, sampling=SamplingParams(temperature=0.8), seed=3)
    configs = [GenerationConfig(max_tokens=16), seeded, GenerationConfig(max_tokens=16)]
    rows = [engine.admit(p, c) for p, c in zip(prompts, configs)]
    for row in rows:
        while not engine.prefill_step(row):
            pass
    steps = []
    with WaitCounter([target, draft]) as waits:
        while any(row.done is None for row in rows):
            before = waits.count
            engine.step()
            steps.append(waits.count - before)
    assert sum(row.done.stats.tree_cycles for row in rows) > 0
    assert steps and all(w == 1 for w in steps), steps


def test_seeded_rows_with_trees_are_their_seeded_samples_alone(tok):
    """Coupled sampling: each tree node is checked against the row's own seeded pick at its
    position, so a row is plain decoding's seeded sample, whatever shares its pass."""
    target, draft = models("llama")
    prompts = [tok.encode(text) for text in PROMPTS[:3]]
    configs, wants = seeded_alone(tok, target, prompts, 10, first_seed=20)
    rows = run_all(tree_engine(tok, target, draft, ["8", "off", "4"]), prompts, configs)
    assert [row.done.tokens for row in rows] == wants
    assert rows[0].done.stats.tree_cycles and rows[2].done.stats.tree_cycles
    assert all(row.done.stats.sampler == "coupled" for row in rows)


def test_unseeded_rows_verify_their_trees_by_the_rejection_rule(tok):
    """Unseeded sampling (the multi-candidate rejection rule) at a temperature so low that the
    target's distribution is its argmax: each row must then be the target's greedy answer,
    through the rejection rule's own kept paths and their compaction."""
    mx.random.seed(0)
    target, draft = models("llama")
    prompts = [tok.encode(text) for text in PROMPTS[6:9]]
    wants = [reference(target, p, 10) for p in prompts]
    cold = GenerationConfig(max_tokens=10, sampling=SamplingParams(temperature=1e-4))
    rows = run_all(tree_engine(tok, target, draft, ["8", "off", "16"]), prompts, [cold] * 3)
    assert [row.done.tokens for row in rows] == wants
    assert rows[0].done.stats.tree_cycles and rows[2].done.stats.tree_cycles
    assert all(row.done.stats.sampler != "coupled" for row in rows)
    assert rows[0].done.stats.draft_accepted + rows[2].done.stats.draft_accepted > 0


def test_a_grammar_row_keeps_chains_beside_tree_rows(tok):
    target, draft = models("llama")
    prompts = [tok.encode(text) for text in PROMPTS[3:6]]
    grammar = Grammar("regex", "[a-z ]{0,40}")
    configs = [
        GenerationConfig(max_tokens=12),
        GenerationConfig(max_tokens=12, grammar=grammar),
        GenerationConfig(max_tokens=12),
    ]
    wants = [done_of(Engine(target, tok).generate(p, c)).tokens for p, c in zip(prompts, configs)]
    rows = run_all(tree_engine(tok, target, draft, ["8"]), prompts, configs)
    assert [row.done.tokens for row in rows] == wants
    assert rows[1].done.stats.tree_cycles == 0
    assert rows[0].done.stats.tree_cycles and rows[2].done.stats.tree_cycles
    # The grammar row's masks were applied in passes that verified the other rows' trees.
    assert any(c.rows > 1 for c in rows[1].events if isinstance(c, Cycle))


def test_gated_deltanet_rows_branch_their_state_in_a_batch(tok):
    """Qwen3.5's Gated DeltaNet layers in a batch's pass over trees: every batch row's state
    follows its own tree (one state per branch), and each row keeps its kept path's state, so
    nothing is fed again; greedy rows and a seeded row are the target alone."""
    target = tiny.near_bigram(tiny.arch_model("qwen3_5", 0, scale=3.0), mix=0.02)
    head = mtp_head(target)
    prompts = [tok.encode(text) for text in PROMPTS[:4]]
    seeded = GenerationConfig(max_tokens=10, sampling=SamplingParams(temperature=0.8), seed=7)
    configs = [GenerationConfig(max_tokens=m) for m in MAX_TOKENS[:3]] + [seeded]
    wants = [done_of(Engine(target, tok).generate(p, c)).tokens for p, c in zip(prompts, configs)]
    turns = itertools.chain(["8"], itertools.cycle(SIZES))
    policy = lambda d: make_tree_policy(next(turns), FixedPolicy(3))  # noqa: E731
    engine = BatchEngine(target, tok, lambda: MTPDrafter(head, target), policy)
    rows = run_all(engine, prompts, configs)
    assert [row.done.tokens for row in rows] == wants
    assert engine.tree_note is None
    assert all(row.done.stats.tree_cycles for i, row in enumerate(rows) if i != 2)
    assert sum(row.done.stats.draft_accepted for row in rows) > 0
    assert all(row.done.stats.refed_tokens == 0 for row in rows)
    assert any(c.rows > 1 for row in rows for c in tree_cycles(row))
    for row in rows:  # each finished row's saved caches hold the ids they say they hold
        saved = row.saved[0]
        assert all(c.offset == len(saved.tokens) for c in saved.cache if isinstance(c, KVCache))


def test_block_drafter_rows_verify_ddtree_and_shaped_trees_in_a_batch(tok, tmp_path):
    """A block drafter's rows (DFlash: marginals sharp on the target's own tokens, from the
    pass's hidden states) verify DDTree's trees and the measured shapes in shared passes."""
    target = tiny.arch_model("qwen3", 0, scale=3.0)
    folder = tiny.save_dflash_folder(tmp_path, target_layer_ids=(0, 1))
    model = load_dflash(folder, tiny.CONFIGS[id(target)])
    prompts = [tok.encode(text) for text in PROMPTS[:3]]
    wants = [reference(target, p, 12) for p in prompts]
    answers = {tuple(p): w for p, w in zip(prompts, wants)}
    engine = BatchEngine(
        target,
        tok,
        lambda: OracleBlock(model, target, answers, sharp=3.0),
        lambda d: make_tree_policy("10", FixedPolicy(3)),
    )
    rows = run_all(engine, prompts, [GenerationConfig(max_tokens=12)] * 3)
    assert [row.done.tokens for row in rows] == wants
    grown = {c.tree.grown for row in rows for c in tree_cycles(row)}
    assert grown == {"ddtree", "shape"}
    assert sum(row.done.stats.draft_accepted for row in rows) > 0


def test_a_recurrent_target_verifies_chains_and_says_so(tok):
    target, draft = models("mamba2")
    prompts = [tok.encode(text) for text in PROMPTS[:2]]
    wants = [reference(target, p, 8) for p in prompts]
    engine = tree_engine(tok, target, draft, ["8"], drafter=ModelDrafter)
    rows = run_all(engine, prompts, [GenerationConfig(max_tokens=8)] * 2)
    assert [row.done.tokens for row in rows] == wants
    assert all(row.done.stats.tree_cycles == 0 for row in rows)
    assert all(row.done.stats.tree_note == RECURRENT_NOTE for row in rows)


def test_a_drafter_failing_in_a_tree_is_switched_off_for_its_row_only(tok, monkeypatch):
    from macspec.engine.trees import propose

    target, draft = models("llama")
    prompts = [tok.encode(text) for text in PROMPTS[:3]]
    wants = [reference(target, p, 14) for p in prompts]
    made: list[ModelDrafter] = []

    def new_drafter():  # the engine's probe first, then each row's: the second row's fails
        made.append(draft_model(draft))
        return made[-1]

    grow, grown = propose.draft_tree, []

    def failing(drafter, *args):  # its third tree fails
        if drafter is made[2]:
            grown.append(1)
            if len(grown) == 3:
                raise IndexError("broken tree")
        return grow(drafter, *args)

    monkeypatch.setattr(propose, "draft_tree", failing)
    engine = BatchEngine(target, tok, new_drafter, lambda d: make_tree_policy("8", FixedPolicy(3)))
    rows = run_all(engine, prompts, [GenerationConfig(max_tokens=14)] * 3)
    assert [row.done.tokens for row in rows] == wants
    assert "switched off (IndexError: broken tree in propose)" in rows[1].done.stats.plain_reason
    assert rows[1].done.stats.tree_cycles > 0  # it grew trees before it failed
    assert all(row.done.stats.plain_reason is None for row in (rows[0], rows[2]))


def test_serve_batches_requests_with_trees(tmp_path, monkeypatch):
    """`macspec serve --max-batch 4 --draft-tree 8` starts (no refusal), and the batching
    server answers concurrent requests as alone, each reporting trees in shared passes."""
    import threading

    from servekit import Expected, client, save_pair

    import macspec.cli.serve as serve_cli
    from macspec.cli import main
    from macspec.models.catalog import resolve_models
    from macspec.models.pairs import open_pair
    from macspec.serve.backend import Backend, Defaults
    from macspec.serve.server import ServerThread

    folders = save_pair(tmp_path)
    asked = []
    monkeypatch.setattr(serve_cli, "serve_models", lambda *args, **kw: asked.append(args))
    flags = ["--draft-model", str(folders[1]), "--max-batch", "4", "--draft-tree", "8"]
    assert main(["serve", "--model", str(folders[0]), *flags]) == 0
    (draft_args, listen) = asked[0][1], asked[0][4]
    assert draft_args[3] == "8" and listen[-2] == 4  # trees, and 4 requests at once

    resolved = resolve_models(None, str(folders[0]), str(folders[1]))
    opened = open_pair(resolved, "3", draft="model", batch=True, draft_tree="8")
    assert opened.engine.trees
    backend = Backend(
        opened.engine, opened.tokenizer, "tiny", context_length=400,
        defaults=Defaults(max_tokens=16), k=3, max_batch=4,
    )  # fmt: skip
    expected = Expected(*folders)
    lengths = [40, 12, 16]
    messages = [[{"role": "user", "content": f"question {i}: why?"}] for i in range(3)]
    answers: dict[int, object] = {}
    with ServerThread(backend) as server:
        api = client(server, api_key="x", timeout=120)

        def ask(i: int) -> None:
            answers[i] = api.chat.completions.create(
                model="tiny", messages=messages[i], max_tokens=lengths[i]
            )

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
    for i, length in enumerate(lengths):
        assert answers[i].choices[0].message.content == expected.text(messages[i], length)
    figures = [answers[i].model_extra["macspec"] for i in answers]
    assert any(f["tree_cycles"] > 0 and f["rows_per_pass"] > 1 for f in figures), figures


def measured_tree_policy(draft) -> TreePolicy:
    """A `--draft-tree auto` row's policy (bound as a batch binds it) that has measured: the
    drafter's first candidate kept 60% of the time at each depth, its second 50% of the rest."""
    policy = make_tree_policy("auto", FixedPolicy(3))
    row = SimpleNamespace(drafter=draft_model(draft), policy=policy)
    policy.bind(row, checked=(None, False))
    draw = random.Random(0).random
    for _ in range(300):
        ranks = []
        while len(ranks) < 3:  # at each depth: the first candidate kept, else the second
            rank = 0 if draw() < 0.6 else 1 if draw() < 0.5 else None
            if rank is None:
                break
            ranks.append(rank)
        outcome = TreeOutcome(8, 3, tuple(ranks), None, 2)
        policy.stats.setdefault("model", RankStats()).observe(
            Cycle(3, 8, len(ranks), 0.0, 0.0, 0.0, 3, 3, timed=False, tree=outcome)
        )
    return policy


@pytest.mark.parametrize(
    ("cost", "rows", "trees"),
    [
        (lambda m: 0.010 + 0.0001 * m, 2, "big"),  # a Mac's GPU, few rows: nodes nearly free
        (lambda m: 0.001 * m, 4, "none"),  # a CPU: every node costs a pass's share
        (lambda m: 0.010 + 2e-7 * m**2, 8, "smaller"),  # wide passes get dear
    ],
)
def test_the_batch_prices_each_rows_tree_on_the_shared_pass(cost, rows, trees):
    from macspec.engine.batch.pricing import BatchPricing

    _, draft = models("llama")

    def sizes(count: int) -> list[int]:
        pricing = BatchPricing()
        for m in range(1, 600):
            pricing.observe(m, cost(m))
        batch = [
            SimpleNamespace(policy=measured_tree_policy(draft), context=[1, 2, 3], fed=2)
            for _ in range(count)
        ]
        pricing.price_trees(batch, [3] * count)
        plans = [row.policy.tree_plan(3, row.context, True) for row in batch]
        return [plan.budget if plan is not None else 0 for plan in plans]

    chosen = sizes(rows)
    if trees == "none":
        assert chosen == [0] * rows
    else:  # `auto` trees run 8 deep here: 16 nodes and more
        assert min(chosen) >= 16
    if trees == "smaller":
        assert max(chosen) < min(sizes(2))  # more rows: each gets a smaller tree
