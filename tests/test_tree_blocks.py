"""A block drafter's trees (issue 44, item 1): at every node budget, macspec's DDTree keeps as
many guesses in expectation as mlx-vlm 0.7.10's `build_ddtree` (the reference) over the same
marginals, sharp or flat, computed exactly from the marginals; over seeded keys its trees are
prefix-closed; the choice between DDTree and the measured shape follows what each kept on the
running request; and every output is the target alone's."""

from __future__ import annotations

import mlx.core as mx
import pytest
import tiny
from losslesskit import PROMPTS, done_of, reference
from mlx_vlm.speculative.ddtree import build_ddtree
from treekit import OracleBlock, TornBlock

from macspec.engine.core.sampling import SamplingParams
from macspec.engine.generate.loop import Engine, GenerationConfig
from macspec.engine.policy.length import FixedPolicy
from macspec.engine.trees.ranks import MIN_TRIES, Growth
from macspec.engine.trees.shapes import Shape, ddtree, expected_kept
from macspec.engine.trees.sizing import make_tree_policy
from macspec.models.drafters import load_dflash

DEPTH, VOCAB = 6, 60


def marginals(kind: str, seed: int) -> mx.array:
    """(DEPTH, VOCAB) log-probabilities: sharp (one id far ahead) or flat (noise only)."""
    logits = mx.random.normal((DEPTH, VOCAB), key=mx.random.key(seed))
    if kind == "sharp":
        logits[mx.arange(DEPTH), mx.arange(DEPTH) * 7 % VOCAB] += 6.0
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)


def value(log_q: mx.array, paths: list[tuple[int, ...]]) -> float:
    """Expected kept guesses of a prefix-closed set of id paths when the target's token at each
    depth follows the marginal there: the sum of the paths' probabilities."""
    q = mx.exp(log_q).tolist()
    total = 0.0
    for ids in paths:
        p = 1.0
        for depth, i in enumerate(ids):
            p *= q[depth][i]
        total += p
    return total


def tree_paths(tree) -> list[tuple[int, ...]]:
    tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
    out = []
    for i in range(tree.size):
        at, ids = i, []
        while at >= 0:
            ids.append(tokens[at])
            at = parents[at]
        out.append(tuple(ids[::-1]))
    return out


@pytest.mark.parametrize("kind", ["sharp", "flat"])
def test_macspecs_ddtree_keeps_as_much_as_the_reference_at_every_budget(kind):
    for seed in range(3):
        log_q = marginals(kind, seed)
        # Acceptance by depth and rank under these marginals, for `expected_kept`.
        accept = mx.sort(mx.exp(log_q), axis=-1)[:, ::-1].tolist()
        for budget in range(1, 41):
            ref = build_ddtree(log_q[None], budget, slot_offset=0)
            theirs = value(log_q, [n.token_ids for n in ref])
            tree = ddtree(log_q, budget)
            ours = value(log_q, tree_paths(tree))
            assert tree.size == len(ref) == budget
            assert ours >= theirs * (1 - 1e-6), (kind, seed, budget, ours, theirs)
            shape = Shape(tuple(tree.parents.tolist()), tuple(tree.ranks.tolist()))
            assert expected_kept(shape, accept) == pytest.approx(ours, rel=1e-4)
            # At least the chain's worth at its depth whenever the chain is in the budget.
            chain = value(log_q, [tuple(mx.argmax(log_q, -1).tolist()[:d]) for d in (1, 2)])
            if budget >= 2:
                assert ours >= chain - 1e-6


def test_ddtree_over_seeded_keys_is_prefix_closed():
    for seed in range(10):
        logits = mx.random.normal((5, 40), key=mx.random.key(seed)) * 2
        gumbel = -mx.log(-mx.log(mx.random.uniform(shape=logits.shape, key=mx.random.key(seed))))
        keys = logits - mx.logsumexp(logits, axis=-1, keepdims=True) + gumbel  # some keys > 0
        tree = ddtree(keys, 12)
        parents, depths = tree.parents.tolist(), tree.depths.tolist()
        for parent, depth in zip(parents, depths):
            assert (parent < 0 and depth == 1) or (parent >= 0 and depths[parent] == depth - 1)


@pytest.mark.parametrize("better", ["ddtree", "shape"])
def test_the_growth_follows_what_each_way_kept(better):
    growth = Growth()
    first = [growth.ddtree_next() for _ in range(2)]
    assert first == [True, False]  # DDTree first, then in turn
    picks = []
    for _ in range(200):
        grown = "ddtree" if growth.ddtree_next() else "shape"
        picks.append(grown)
        growth.add(grown, 3 if grown == better else 1)
    settled = picks[2 * MIN_TRIES :]
    assert settled.count(better) > 0.85 * len(settled)
    assert len(set(settled)) == 2  # the other way is still probed


@pytest.fixture(scope="module")
def block_model(tmp_path_factory):
    target = tiny.arch_model("qwen3", 0, scale=3.0)
    folder = tiny.save_dflash_folder(tmp_path_factory.mktemp("dflash"), target_layer_ids=(0, 1))
    return target, load_dflash(folder, tiny.CONFIGS[id(target)])


@pytest.mark.parametrize("temp", [0.0, 0.7], ids=["greedy", "seeded"])
@pytest.mark.parametrize("drafter", ["torn", "sharp"])
def test_block_trees_as_the_policy_chooses_are_the_target_alone(tok, block_model, temp, drafter):
    target, model = block_model
    prompts = [tok.encode(text) for text in PROMPTS[:6]]
    answers = {tuple(p): reference(target, p, 16) for p in prompts}
    if drafter == "torn":
        made = TornBlock(model, target, answers)
    else:
        made = OracleBlock(model, target, answers, 5.0)
    engine = Engine(target, tok, made, make_tree_policy("8", FixedPolicy(4)))
    plain = Engine(target, tok)
    trees = 0
    for i, prompt in enumerate(prompts):
        config = GenerationConfig(max_tokens=16, sampling=SamplingParams(temperature=temp), seed=i)
        done = done_of(engine.generate(prompt, config))
        want = (
            answers[tuple(prompt)] if temp == 0 else done_of(plain.generate(prompt, config)).tokens
        )
        assert done.tokens == want
        trees += done.stats.tree_cycles
    growth = engine.policy.growth
    assert trees > 0 and growth.planned["ddtree"] > 0 and growth.planned["shape"] > 0
