"""One tree cycle of the engine: verify a draft tree in one target pass, keep the longest
accepted path, compact the target's cache to it, and record the cycle.

The counterpart of `Engine._speculate` for trees, with the same contract: the tree stays on the
device into the verify pass, and the verdict, the kept path and its ids are read together, in
the cycle's one wait.
"""

from __future__ import annotations

import time
from typing import Protocol

import mlx.core as mx

from macspec.engine.caches import tree_attention as treeattn
from macspec.engine.caches.cached import CachedModel
from macspec.engine.core.cycle import Cycle, TreeOutcome
from macspec.engine.core.sampling import Randomness, SamplingParams, probabilities
from macspec.engine.core.taps import Hidden
from macspec.engine.drafters.guard import DrafterGuard
from macspec.engine.drafters.protocol import Drafter
from macspec.engine.policy.length import DraftPolicy
from macspec.engine.trees import propose as treedraft
from macspec.engine.trees.shapes import TreeDraft
from macspec.engine.trees.verdict import (
    ancestors,
    greedy_tree_verdict,
    positions,
    rejection_tree_verdict,
    visibility,
)


class Engine(Protocol):
    """What a tree cycle reads of the engine that runs it (the generate loop's `Engine`,
    a room above this one)."""

    target: CachedModel
    drafter: Drafter | None
    guard: DrafterGuard
    policy: DraftPolicy | None
    vocab_size: int | None
    eos_ids: frozenset[int]


def verify_tree(
    engine: Engine, context: list[int], tree: TreeDraft, requested: int,
    params: SamplingParams, rng: Randomness | None, begun: float, timed: bool,
) -> tuple[Cycle, list[int]]:  # fmt: skip
    """Verify `tree` after `context` in one target pass; (the cycle's record, the ids kept:
    the kept path's, then the target's own)."""
    target = engine.target
    if timed:
        mx.eval(tree.tokens)
    drafted = time.perf_counter()
    pending = context[len(target) :]
    fed = len(pending)
    ancestry = ancestors(tree)
    ids = mx.concatenate([mx.array(pending, mx.uint32), tree.tokens])
    target.checkpoint()
    # Each pass row's parent row, for recurrent layers (a fixed shape: known on the host).
    rows = None
    if tree.shape is not None:
        nodes = [fed + p if p >= 0 else fed - 1 for p in tree.shape.parents]
        rows = [j - 1 for j in range(fed)] + nodes
    with (
        target.holding_hidden() as held,
        treeattn.tree_pass(
            target.cache, positions(tree, fed), visibility(ancestry, fed), rows
        ) as record,
    ):
        logits = target.forward(ids)[fed - 1 :, : engine.vocab_size]
    read = tree_verdict(logits, tree, ancestry, params, rng, len(context))
    # The cycle's one wait: the verdict and the kept path.
    values = read.tolist()
    verified = time.perf_counter()
    n, token, stop_rank, path, path_ids, path_ranks, ends = read_tree(values, tree, engine.eos_ids)
    _keep_path(engine, context, fed, path[:n], path_ids[:n], held, record)
    kept = path_ids[:n] + [token]
    context += kept
    engine.guard.call("release", treedraft.release, engine.drafter, tree.base)
    engine.guard.call("rollback", engine.drafter.rollback, len(context) - 1)
    outcome = tree_outcome(tree, n, ends, stop_rank, path, path_ranks)
    cycle = Cycle(
        requested=requested,
        proposed=tree.size,
        accepted=n,
        draft_s=drafted - begun if timed else 0.0,
        verify_s=verified - (drafted if timed else begun),
        overhead_s=time.perf_counter() - verified,
        draft_steps=tree.steps,
        draft_fed=tree.fed,
        draft_source=tree.source,
        fed=fed + tree.size,
        refed=fed - 1,
        timed=timed,
        tree=outcome,
    )
    return cycle, kept


def tree_verdict(
    logits: mx.array, tree: TreeDraft, ancestry: mx.array, params: SamplingParams,
    rng: Randomness | None, position: int,
) -> mx.array:  # fmt: skip
    """The verdict vector over `tree` (`greedy_tree_verdict`'s layout); logits: (N + 1, V) the
    target's after the root and after each node; `position`: the root's next position."""
    if params.greedy:
        return greedy_tree_verdict(logits, tree, ancestry)
    if rng.noise is not None:  # coupled: the target's own seeded pick at each node
        scores = mx.log(probabilities(logits, params))
        rows = rng.noise.rows(position, tree.depth + 1, scores.shape[-1])
        depth_of_row = mx.concatenate([mx.zeros((1,), mx.int32), tree.depths])
        return greedy_tree_verdict(scores + rows[depth_of_row], tree, ancestry)
    return rejection_tree_verdict(probabilities(logits, params), tree, rng.keys.next())


def read_tree(values: list[int], tree: TreeDraft, eos_ids: frozenset[int]) -> tuple:
    """(kept, token, stop rank, path, path ids, path ranks, kept through the first end of
    sequence) from a verdict vector read on the host; a kept end of sequence ends the answer:
    nothing after it is kept."""
    d = tree.depth
    n, token, stop_rank = values[:3]
    path, path_ids, path_ranks = values[3 : 3 + d], values[3 + d : 3 + 2 * d], values[3 + 2 * d :]
    ends = next((i + 1 for i, t in enumerate(path_ids[:n]) if t in eos_ids), n)
    return min(n, ends), token, stop_rank, path, path_ids, path_ranks, ends


def tree_outcome(
    tree: TreeDraft, n: int, ends: int, stop_rank: int, path: list[int], path_ranks: list[int]
) -> TreeOutcome:
    """What a tree cycle that kept `n` nodes of `path` adds to its record."""
    stop = tree.shape.children[path[n - 1] + 1 if n else 0] if tree.shape is not None else ()
    return TreeOutcome(
        nodes=tree.size,
        depth=tree.depth,
        path_ranks=tuple(path_ranks[:n]),
        stop_rank=stop_rank if stop_rank >= 0 and n == ends else None,
        stop_children=len(stop),
        grown=tree.grown,
    )


def _keep_path(
    engine: Engine, context: list[int], fed: int, path: list[int], ids: list[int], held: list,
    record,
) -> None:  # fmt: skip
    """The target's cache keeps the ids it was fed and the kept path's nodes; the drafter
    gets the hidden states of exactly those."""
    target = engine.target
    start = len(context)  # the first node's slot
    rows = list(range(fed)) + [fed + node for node in path]  # the kept chain of pass rows
    treeattn.keep_rows(target.cache, start, path, record, rows)
    target.replace_tail(start, ids)
    if held:
        first, hidden = held[0]
        rows = mx.array(rows, mx.int32)
        kept = Hidden(
            final=hidden.final[rows] if hidden.final is not None else None,
            layers={i: h[rows] for i, h in hidden.layers.items()},
        )
        target.hand_hidden(first, kept)


def propose_tree(
    engine: Engine, context: list[int], k: int, params: SamplingParams, rng: Randomness | None
) -> TreeDraft | None:
    """The tree the engine's policy plans for this cycle, queued on the device; None: a chain."""
    plan = engine.policy.tree_plan(k, context, params.greedy or rng.noise is not None)
    if plan is None:
        return None
    tree = treedraft.draft_tree(engine.drafter, context, plan, params, rng)
    if tree is not None:
        mx.async_eval(tree.tokens)
    return tree
