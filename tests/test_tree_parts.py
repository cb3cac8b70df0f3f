"""The parts of a tree cycle, each against what it stands for: a tree pass against sequential
passes, the kept path's cache against a fresh prefill, DDTree against mlx-vlm's, the measured
shape against every other tree of its size, and `auto`'s pricing against two cost curves."""

from __future__ import annotations

import itertools
import math

import mlx.core as mx
import pytest
import tiny
from mlx_lm.models.cache import KVCache, QuantizedKVCache, make_prompt_cache
from mlx_vlm.speculative.ddtree import build_ddtree

from macspec.engine.caches import tree_attention as treeattn
from macspec.engine.core.cycle import Cycle, TreeOutcome
from macspec.engine.drafters.model import ModelDrafter
from macspec.engine.generate.loop import Engine
from macspec.engine.policy.length import FixedPolicy
from macspec.engine.trees.ranks import RankStats
from macspec.engine.trees.shapes import Shape, best_first, ddtree, expected_kept
from macspec.engine.trees.sizing import TreePolicy

# A root, two children, a grandchild under each, and a great-grandchild: (token, parent).
NODES = [(20, -1), (21, -1), (22, 0), (23, 1), (24, 2)]


def path(i: int) -> list[int]:
    out = []
    while i >= 0:
        out.append(NODES[i][0])
        i = NODES[i][1]
    return out[::-1]


@pytest.mark.parametrize("kind", ["llama", "qwen3", "llama, 8-bit cache"])
def test_a_tree_pass_is_the_sequential_passes_and_keeps_one_path(kind):
    if kind == "qwen3":
        model = tiny.arch_model("qwen3", 0, scale=3.0)
    else:  # head_dim 32: one quantization group
        model = tiny.random_model(0, tiny.model_args(hidden=128, heads=4, kv_heads=2), scale=3.0)
    assert treeattn.tree_ready(model, make_prompt_cache(model)) is None
    prompt = [5, 6, 7, 8, 9]

    def committed():
        """A cache holding all the prompt but its last id."""
        cache = make_prompt_cache(model)
        model(mx.array(prompt[:-1])[None], cache=cache)
        if "8-bit" in kind:
            cache = [c.to_quantized(group_size=32, bits=8) for c in cache]
        return cache

    def sequential(ids: list[int]) -> mx.array:
        """Logits of the last of `ids` fed in one causal pass after the committed ids."""
        return model(mx.array(ids)[None], cache=committed())[0, -1]

    cache = committed()
    depths = [1, 1, 2, 2, 3]
    n = len(NODES)
    # The root sees itself; a node sees the root, its ancestors and itself.
    visible = [[True] + [False] * n] + [
        [True] + [path(j) == path(i)[: len(path(j))] for j in range(n)] for i in range(n)
    ]
    ids = mx.array([prompt[-1]] + [t for t, _ in NODES])[None]
    with treeattn.tree_pass(cache, mx.array([0, *depths], mx.int32), mx.array(visible)):
        logits = model(ids, cache=cache)[0]
    assert all(type(c) in (KVCache, QuantizedKVCache) for c in cache)  # classes restored
    for i in range(n):
        assert mx.allclose(logits[i + 1], sequential(prompt[-1:] + path(i)), atol=1e-4)
    # Keep the path to node 4 (nodes 0, 2, 4): the next pass is a sequential one's.
    treeattn.keep_rows(cache, len(prompt), [0, 2, 4])
    assert cache[0].offset == len(prompt) + 3
    after = model(mx.array([9])[None], cache=cache)[0, -1]
    assert mx.allclose(after, sequential(prompt[-1:] + path(4) + [9]), atol=1e-4)


def test_a_model_whose_positions_ignore_the_tree_is_caught(monkeypatch):
    model = tiny.random_model(0, scale=3.0)
    assert treeattn.install(model) == 2
    assert treeattn.check_tree_pass(model, make_prompt_cache(model), [5, 6, 7, 8]) is None
    tree_rope = treeattn._subclasses[type(model.model.layers[0].self_attn.rope).__mro__[1]]
    monkeypatch.setattr(tree_rope, "__call__", tree_rope.__mro__[1].__call__)  # sequential rope
    why = treeattn.check_tree_pass(model, make_prompt_cache(model), [5, 6, 7, 8])
    assert why is not None and why.startswith("a tree pass does not match")


def test_ddtree_finds_the_prefixes_mlx_vlms_build_ddtree_finds():
    for seed, budget in enumerate([3, 10, 25, 40, 7, 16]):
        logits = mx.random.normal((5, 40), key=mx.random.key(seed)) * (1 + seed % 3)
        theirs = {n.token_ids for n in build_ddtree(logits[None], budget, slot_offset=0)}
        tree = ddtree(logits - mx.logsumexp(logits, axis=-1, keepdims=True), budget)
        tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
        ours = set()
        for i in range(tree.size):
            at, ids = i, []
            while at >= 0:
                ids.append(tokens[at])
                at = parents[at]
            ours.add(tuple(ids[::-1]))
        assert ours == theirs
        assert all(p < i for i, p in enumerate(parents))  # level order
        assert tree.depths.tolist() == sorted(tree.depths.tolist())


def all_shapes(size: int, depth: int, ranks: int):
    """Every tree of `size` rank paths, prefix-closed with contiguous sibling ranks."""
    paths = [p for d in range(1, depth + 1) for p in itertools.product(range(ranks), repeat=d)]
    for chosen in itertools.combinations(paths, size):
        kept = set(chosen)
        if all(
            (len(p) == 1 or p[:-1] in kept) and (p[-1] == 0 or p[:-1] + (p[-1] - 1,) in kept)
            for p in kept
        ):
            yield kept


def test_the_measured_shape_is_the_best_tree_of_its_size():
    accept = [[0.5, 0.3], [0.7, 0.2], [0.6, 0.25]]

    def value(paths) -> float:
        return sum(math.prod(accept[d][r] for d, r in enumerate(p)) for p in paths)

    for size in (1, 3, 5, 7):
        shape = best_first(accept, size, 3)
        assert shape.size == size
        best = max(value(p) for p in all_shapes(size, 3, 2))
        assert expected_kept(shape, accept) == pytest.approx(best)
    # No second candidate is ever kept: the best tree is the chain.
    assert best_first([[0.9, 0.0]] * 4, 4, 4).is_chain()
    assert Shape.chain(3).depths == (1, 2, 3)


def test_ranks_are_learnt_from_greedy_trees_and_rejections():
    stats = RankStats(memory=1.0)
    for i in range(200):  # the target's token: the drafter's second choice half the time
        ranks = (0,) if i % 2 else ()
        outcome = TreeOutcome(nodes=4, depth=2, path_ranks=ranks, stop_rank=1, stop_children=0)
        stats.observe(Cycle(2, 4, len(ranks), 0, 0, 0, 1, 1, tree=outcome))
    accept = stats.accept()
    assert accept[0][0] == pytest.approx(0.5, abs=0.02)
    assert accept[0][1] == pytest.approx(0.5, abs=0.02)
    assert accept[1][0] < 0.05 and accept[1][1] > 0.9


def timed_cycle(m: int, seconds: float, tree: TreeOutcome | None = None, step: float = 0.0):
    proposed = tree.nodes if tree is not None else m - 1
    accepted = len(tree.path_ranks) if tree is not None else 0
    return Cycle(
        requested=3, proposed=proposed, accepted=accepted, draft_s=step * 3, verify_s=seconds,
        overhead_s=0.0, draft_steps=3, draft_fed=3, draft_source="model", fed=m, tree=tree,
    )  # fmt: skip


@pytest.mark.parametrize("curve", ["flat", "steep"])
def test_auto_prices_trees_by_the_measured_cost_of_a_pass(tok, curve):
    """On a flat cost curve (an Apple GPU) a tree of many nodes costs about a chain's pass and
    keeps more: auto grows one. On a steep one (a CPU) it stays with the chain."""
    target = tiny.random_model(0, scale=3.0)
    policy = TreePolicy(FixedPolicy(3), budget=None)
    Engine(target, tok, ModelDrafter(tiny.noisy_copy(target, 0.05, seed=3)), policy)

    def cost(m):
        return 0.01 * (1 + 0.02 * m) if curve == "flat" else 0.01 * m

    for m in (1, 2, 3, 4, 5, 9, 17):  # plain steps, chains and trees, timed
        policy.observe(timed_cycle(m, cost(m), step=0.001))
    for i in range(300):  # the drafter's first choice 2 times in 3, else its second
        ranks, stop = ((0, 0, 0), None) if i % 3 else ((), 1)
        outcome = TreeOutcome(nodes=16, depth=3, path_ranks=ranks, stop_rank=stop, stop_children=0)
        policy.observe(timed_cycle(17, cost(17), outcome))
    k = policy.draft_length()
    chosen = policy._chosen
    if curve == "flat":
        assert chosen is not None and chosen >= 8 and k >= 1
        shape = best_first(policy._accept(), chosen, 8)
        assert policy.expected_rate(shape, tree=True) > policy.expected_rate(Shape.chain(3))
    else:
        assert chosen is None and k == 3
