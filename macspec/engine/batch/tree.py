"""Draft trees in a batch (`--draft-tree` with `--max-batch` > 1): rows with trees of their own
sizes, chain rows and plain rows share one target pass.

A row's tree goes into the pass after its ids still to feed, as a single request's does
(trees/cycle.py), each row ragged in the padded pass. For the pass, each attention layer's
rows cache (caches/rows.py) takes one mask per row: its committed columns, then among its pass
columns its own ancestors and itself; the rope rotates every id at its own position (the
root's plus the node's depth), one offset per id (caches/tree_attention.py). Chain rows are
trees without branches there. After the verdict, read in the cycle's one wait, a tree row's
kept path moves into contiguous columns of its row, and the row's length ends after it: every
row compacts and rolls back on its own, on full attention and sliding windows alike (a
batch's windowed layers keep their whole history, the mask applies the window).

Rows keep chains where trees cannot be verified here: a target with recurrent layers (said in
each row's `tree_note`), and rows under a grammar (their masks follow one line of guesses).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache, KVCache

from macspec.engine.batch.row import Row
from macspec.engine.caches import recurrent
from macspec.engine.caches import tree_attention as treeattn
from macspec.engine.caches import tree_recurrent as treerecurrent
from macspec.engine.caches.rows import RowsArraysCache, RowsKVCache
from macspec.engine.core.cycle import Cycle
from macspec.engine.core.taps import Hidden
from macspec.engine.trees import propose as treedraft
from macspec.engine.trees.cycle import propose_tree, read_tree, tree_outcome, tree_verdict
from macspec.engine.trees.shapes import TreeDraft
from macspec.engine.trees.sizing import TreePolicy
from macspec.engine.trees.verdict import ancestors, positions, visibility

RECURRENT_NOTE = (
    "tree off: the target has recurrent layers other than Gated DeltaNet, which a batch "
    "cannot branch; chains"
)


@dataclass
class TreePlan:
    """A tree row's cycle: the ids it feeds again, then its tree's nodes."""

    pending: list[int]
    tree: TreeDraft
    requested: int

    @property
    def width(self) -> int:
        return len(self.pending) + self.tree.size

    def ids(self) -> mx.array:
        return mx.concatenate([mx.array(self.pending, mx.uint32), self.tree.tokens])


def tree_note(model, caches: list, branches: bool, ids: list[int]) -> str | None:
    """Why the batch's rows cannot verify trees (None: they can), checked once: a small tree
    pass against the sequential one (`ids`: 3 ids of real text). `branches`: whether every
    recurrent layer (if any) is Gated DeltaNet, whose state a tree pass branches."""
    recurrent_layers = any(isinstance(c, RowsArraysCache) for c in caches)
    if recurrent_layers and not branches:
        return RECURRENT_NOTE
    if treeattn.install(model) == 0:
        return "tree off: the target has no rope module to place tree nodes at their depth; chains"
    # A few ids: no window is reached, so plain attention caches stand for windowed ones.
    fresh = [
        ArraysCache(len(c.cache)) if isinstance(c, RowsArraysCache) else KVCache() for c in caches
    ]
    why = treeattn.check_tree_pass(model, fresh, ids)
    return why and f"tree off: {why}; chains"


def bind(row: Row, note: str | None, recurrent_layers: bool) -> None:
    """A row with a tree policy learns whether it may grow trees (it drafts for itself), and
    whether they need a fixed shape (recurrent layers branch along the shape's parents)."""
    if isinstance(row.policy, TreePolicy):
        row.policy.bind(row, checked=(note, recurrent_layers))


def plan_tree(row: Row, k: int) -> TreePlan | None:
    """The row's tree for this cycle, queued on the device; None: a chain (or its drafter
    failed: it is off, and the caller's chain plan finds nothing to propose)."""
    if k <= 0 or row.constraint is not None or not isinstance(row.policy, TreePolicy):
        return None
    params, rng = row.answer.config.sampling, row.answer.rng
    tree = row.guard.call("propose", propose_tree, row, row.context, k, params, rng)
    if tree is None:
        return None
    return TreePlan(row.context[row.fed :], tree, k)


def width_of(plan) -> int:
    """Ids a row's plan feeds (a tree plan, or a chain's (pending, guesses, ...))."""
    if isinstance(plan, TreePlan):
        return plan.width
    return len(plan[0]) + len(plan[1])


@contextmanager
def tree_pass(
    caches: list, plans: list, width: int, recurrent: bool
) -> Iterator[tuple[dict[int, mx.array], treerecurrent.RowsTreeRecord | None]]:
    """The batch's pass over `plans` with trees among them: each row's mask and positions,
    and (`recurrent`: Gated DeltaNet layers) each pass row's parent. Yields each tree row's
    ancestry (by row index), which its verdict reads, and the recurrent layers' record."""
    rows = len(plans)
    place = mx.repeat(mx.arange(width, dtype=mx.int32)[None], rows, axis=0)
    sees = mx.repeat(mx.tril(mx.ones((width, width), mx.bool_))[None], rows, axis=0)
    parents = [list(range(-1, width - 1)) for _ in plans]  # chains, padding included
    ancestry = {}
    for i, plan in enumerate(plans):
        if isinstance(plan, TreePlan):
            fed, n = len(plan.pending), plan.width
            ancestry[i] = ancestors(plan.tree)
            place[i, :n] = positions(plan.tree, fed)
            sees[i, :n, :n] = visibility(ancestry[i], fed)
            if recurrent:
                shape = plan.tree.shape
                parents[i][fed:n] = [fed + p if p >= 0 else fed - 1 for p in shape.parents]
    layers = [c for c in caches if isinstance(c, RowsKVCache)]
    for c in layers:
        c.tree = (place, sees)
    record = treerecurrent.RowsTreeRecord(parents) if recurrent else None
    try:
        with ExitStack() as stack:
            stack.enter_context(treeattn.rows_positions(place))
            if record is not None:
                stack.enter_context(treerecurrent.tree_rows(record))
            yield ancestry, record
    finally:
        for c in layers:
            c.tree = None


def keep_states(caches: list, record: treerecurrent.RowsTreeRecord, row: int, path) -> None:
    """After a pass over trees: batch row `row`'s recurrent layers take their state after its
    pass rows `path` (its kept chain of rows, from the first)."""
    update = recurrent.original_update()
    layers = [c for c in caches if isinstance(c, RowsArraysCache)]
    for index, c in enumerate(layers):
        conv, state = treerecurrent.rows_kept(record, index, row, list(path), update)
        c.cache[0][row : row + 1], c.cache[1][row : row + 1] = conv, state


def tree_row_verdict(
    row: Row, plan: TreePlan, ancestry: mx.array, logits: mx.array, vocab_size: int | None
) -> mx.array:
    """The row's verdict vector over its tree, on the device."""
    fed = len(plan.pending)
    logits = logits[fed - 1 : plan.width, :vocab_size]
    params, rng = row.answer.config.sampling, row.answer.rng
    return tree_verdict(logits, plan.tree, ancestry, params, rng, len(row.context))


def settle_tree(engine, row: Row, index: int, plan: TreePlan, values: list[int], hidden,
                rows: int, times: tuple[float, float, float]) -> list[int]:  # fmt: skip
    """After the read: keep the row's path in its caches, hand its drafter the kept hidden
    states, release and roll back the drafter, record the cycle and deliver the ids. Returns
    the pass rows kept (the ids fed again, then the path's nodes)."""
    begun, drafted, verified = times
    tree, fed = plan.tree, len(plan.pending)
    n, token, stop_rank, path, path_ids, path_ranks, ends = read_tree(values, tree, engine.eos_ids)
    start = row.fed + fed  # the first node's column
    for c in engine.caches:
        if isinstance(c, RowsKVCache):
            c.keep_path(index, start, path[:n])
    kept_rows = list(range(fed)) + [fed + node for node in path[:n]]
    if hidden is not None:
        kept = mx.array(kept_rows, mx.int32)
        part = Hidden(
            final=None if hidden.final is None else hidden.final[index][kept],
            layers={k: v[index][kept] for k, v in hidden.layers.items()},
        )
        row.guard.call("add_hidden", row.drafter.add_hidden, row.fed, part)
    row.fed = start + n
    kept_ids = path_ids[:n] + [token]
    row.context += kept_ids
    row.guard.call("release", treedraft.release, row.drafter, tree.base)
    row.guard.call("rollback", row.drafter.rollback, len(row.context) - 1)
    cycle = Cycle(
        requested=plan.requested,
        proposed=tree.size,
        accepted=n,
        draft_s=(drafted - begun) / rows,
        verify_s=verified - drafted,
        overhead_s=time.perf_counter() - verified,
        draft_steps=tree.steps,
        draft_fed=tree.fed,
        draft_source=tree.source,
        fed=plan.width,
        refed=fed - 1,
        timed=True,
        rows=rows,
        tree=tree_outcome(tree, n, ends, stop_rank, path, path_ranks),
    )
    engine.deliver(row, cycle, kept_ids)
    return kept_rows
