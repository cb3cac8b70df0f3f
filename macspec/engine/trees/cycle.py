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
    if params.greedy:
        read = greedy_tree_verdict(logits, tree, ancestry)
    elif rng.noise is not None:  # coupled: the target's own seeded pick at each node
        scores = mx.log(probabilities(logits, params))
        rows = rng.noise.rows(len(context), tree.depth + 1, scores.shape[-1])
        depth_of_row = mx.concatenate([mx.zeros((1,), mx.int32), tree.depths])
        read = greedy_tree_verdict(scores + rows[depth_of_row], tree, ancestry)
    else:
        p = probabilities(logits, params)
        read = rejection_tree_verdict(p, tree, rng.keys.next())
    # The cycle's one wait: the verdict and the kept path.
    values = read.tolist()
    verified = time.perf_counter()
    d = tree.depth
    n, token, stop_rank = values[:3]
    path, path_ids, path_ranks = values[3 : 3 + d], values[3 + d : 3 + 2 * d], values[3 + 2 * d :]
    # A kept end of sequence ends the answer: nothing after it is kept.
    ends = next((i + 1 for i, t in enumerate(path_ids[:n]) if t in engine.eos_ids), n)
    n = min(n, ends)
    _keep_path(engine, context, fed, path[:n], path_ids[:n], held, record)
    kept = path_ids[:n] + [token]
    context += kept
    engine.guard.call("release", treedraft.release, engine.drafter, tree.base)
    engine.guard.call("rollback", engine.drafter.rollback, len(context) - 1)
    stop = tree.shape.children[path[n - 1] + 1 if n else 0] if tree.shape is not None else ()
    outcome = TreeOutcome(
        nodes=tree.size,
        depth=tree.depth,
        path_ranks=tuple(path_ranks[:n]),
        stop_rank=stop_rank if stop_rank >= 0 and n == ends else None,
        stop_children=len(stop),
        grown=tree.grown,
    )
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
