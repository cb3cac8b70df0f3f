"""Draft trees: several candidates per position, verified in one target pass.

A tree's nodes are in level order (every parent before its children); node i is the
`ranks[i]`-th candidate (0-based, in the drafter's order) after its parent `parents[i]` (-1:
the root, the last committed id), at depth `depths[i]` (1 = the next position).

Two ways to grow one:
- `grow`, from a `Shape` fixed before drafting: a draft model or an MTP head runs one step per
  level over the level's inner nodes, a DFlash block fills every level from one pass. The shape
  comes from the acceptance measured by depth and candidate rank (`best_first`), so it is the
  best tree of its size under what was measured (Sequoia's idea), and it depends on no draw:
  that is what keeps the multi-candidate rejection rule exact.
- `ddtree`, from a block's per-position marginals (DDTree, Algorithm 1, as in mlx-vlm's
  `speculative/ddtree.py`): the budget's most likely prefixes, on the device. Its shape depends
  on the drafter's probabilities, so it serves greedy and coupled runs only.
Everything stays on the device until the verdict is read.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property

import mlx.core as mx

from macspec.engine.core.sampling import Randomness, SamplingParams, probabilities

FLOOR = -100.0
"""Log-probabilities below this count as this (e^-100 is nothing): cumulative scores stay
finite, so a child always scores below its parent."""
DEPTH_TIE = 1e-6
"""A node's score is made this much worse, relatively, per depth (and by a tenth of it
absolutely, for a score of 0): a child never ties its parent, and no node loses to a shallower
one it outscores by more than float32's noise (1e-3 did: a few nodes per tree, 1e-3 of their
value each)."""


@dataclass(frozen=True)
class Shape:
    """A tree's shape, fixed before drafting: node i is the ranks[i]-th candidate of its parent
    parents[i] (-1: the root); nodes in level order, ranks of siblings 0, 1, 2, ..."""

    parents: tuple[int, ...]
    ranks: tuple[int, ...]

    @classmethod
    def chain(cls, k: int) -> Shape:
        return cls(tuple(range(-1, k - 1)), (0,) * k)

    @property
    def size(self) -> int:
        return len(self.parents)

    @cached_property
    def depths(self) -> tuple[int, ...]:
        depths: list[int] = []
        for parent in self.parents:
            depths.append(1 if parent < 0 else depths[parent] + 1)
        return tuple(depths)

    @property
    def depth(self) -> int:
        return max(self.depths, default=0)

    @cached_property
    def children(self) -> tuple[tuple[int, ...], ...]:
        """Children of the root (index 0) and of node i (index i + 1), in rank order."""
        kids: list[list[int]] = [[] for _ in range(self.size + 1)]
        for i, parent in enumerate(self.parents):
            kids[parent + 1].append(i)
        return tuple(tuple(sorted(k, key=lambda i: self.ranks[i])) for k in kids)

    @property
    def width(self) -> int:
        """The most children of one node."""
        return max((len(k) for k in self.children), default=0)

    @cached_property
    def rows(self) -> tuple[int, ...]:
        """For the root (index 0) and node i (index i + 1): the row of the drafter's scores its
        children are drawn from (root 0, then inner nodes in node order), or -1 for a leaf."""
        rows, count = [], 0
        for kids in self.children:
            rows.append(count if kids else -1)
            count += bool(kids)
        return tuple(rows)

    def level(self, depth: int) -> list[int]:
        return [i for i, d in enumerate(self.depths) if d == depth]

    def is_chain(self) -> bool:
        return self.width <= 1


def best_first(accept: Sequence[Sequence[float]], budget: int, max_depth: int) -> Shape:
    """The `budget` rank paths of highest expected value, as DDTree's heap finds them, scored by
    `accept[d][r]`: the measured chance that the candidate of rank r is kept at depth d + 1
    (given the path to it was). A node's value is the product along its path, so the tree's
    expected kept length is the sum of its nodes' values."""
    ranks_per_depth = min(len(a) for a in accept) if accept else 0
    if budget < 1 or max_depth < 1 or ranks_per_depth < 1:
        return Shape((), ())

    def value(depth: int, rank: int) -> float:
        row = accept[min(depth, len(accept) - 1)]
        return math.log(max(row[rank], 1e-12))

    # (-log value, tie, depth, rank, parent index, log value of the parent)
    heap = [(-value(0, 0), 0, 0, 0, -1, 0.0)]
    parents: list[int] = []
    ranks: list[int] = []
    depths: list[int] = []
    count = 1
    while heap and len(parents) < budget:
        neg, _, depth, rank, parent, base = heapq.heappop(heap)
        index = len(parents)
        parents.append(parent)
        ranks.append(rank)
        depths.append(depth + 1)
        if rank + 1 < ranks_per_depth:  # its next sibling
            score = base + value(depth, rank + 1)
            heapq.heappush(heap, (-score, count, depth, rank + 1, parent, base))
            count += 1
        if depth + 1 < max_depth:  # its first child
            heapq.heappush(heap, (neg - value(depth + 1, 0), count, depth + 1, 0, index, -neg))
            count += 1
    # Level order: by depth, then as popped (parents keep their relative order).
    order = sorted(range(len(parents)), key=lambda i: (depths[i], i))
    new = {old: new for new, old in enumerate(order)}
    return Shape(
        tuple(new[parents[i]] if parents[i] >= 0 else -1 for i in order),
        tuple(ranks[i] for i in order),
    )


def expected_kept(shape: Shape, accept: Sequence[Sequence[float]]) -> float:
    """Expected guesses kept by a tree of this shape, under `accept` (as in `best_first`)."""
    values: list[float] = []
    total = 0.0
    for parent, rank, depth in zip(shape.parents, shape.ranks, shape.depths):
        row = accept[min(depth - 1, len(accept) - 1)]
        value = (values[parent] if parent >= 0 else 1.0) * (row[rank] if rank < len(row) else 0)
        values.append(value)
        total += value
    return total


@dataclass
class TreeDraft:
    """One cycle's tree of guesses, on the device (the counterpart of `Draft`)."""

    tokens: mx.array
    """(N,) the nodes' ids."""
    parents: mx.array
    """(N,) int32: each node's parent, -1 for the root."""
    depths: mx.array
    """(N,) int32: 1 for the root's children."""
    ranks: mx.array
    """(N,) int32: each node's rank among its siblings, 0 first."""
    size: int
    depth: int
    keys: mx.array
    """(R, V) the drafter's order of candidates at each row: logits (greedy), log q + the
    coupled noise, or log q + Gumbel noise (the rejection rule's draws without replacement)."""
    row_of: mx.array
    """(N + 1,) int32: the row of `keys` the root's (0) and each node's (i + 1) children were
    ranked in; -1 where the drafter scored nothing."""
    q: mx.array | None = None
    """(R, V) the draft distributions (the rejection rule only)."""
    shape: Shape | None = None
    """The shape, when it was fixed before drafting (every rejection-rule tree)."""
    grown: str = "shape"
    """'shape' (grown to a fixed shape) or 'ddtree' (DDTree's best-first over marginals)."""
    steps: int = 0
    fed: int = 0
    source: str = "model"
    base: int = 0
    """Ids committed when it was drafted (a draft model's cache goes back there)."""


class Scorer:
    """Turns a drafter's logits at one depth into the order its candidates are taken in."""

    def __init__(self, params: SamplingParams, rng: Randomness | None, first_position: int):
        self.params, self.rng = params, rng
        self.first = first_position
        """Position of the root's children (the next id)."""

    @property
    def rejection(self) -> bool:
        return self.rng is not None and self.rng.noise is None

    def __call__(self, logits: mx.array, depth: int) -> tuple[mx.array, mx.array | None]:
        """(keys, q) for rows of logits whose children sit at depth + 1."""
        if self.params.greedy:
            return logits.astype(mx.float32), None
        q = probabilities(logits, self.params)
        log_q = mx.maximum(mx.log(q), FLOOR)
        if self.rng.noise is not None:  # coupled: the target's own noise at that position
            noise = self.rng.noise.rows(self.first + depth, 1, q.shape[-1])
            return log_q + noise, None
        u = mx.random.uniform(shape=q.shape, key=self.rng.keys.next())
        gumbel = -mx.log(-mx.log(mx.clip(u, 1e-20, 1.0 - 1e-7)))
        # Gumbel-top-m: the first m draws without replacement; zero-probability ids last.
        return mx.where(q > 0, log_q + gumbel, -mx.inf), q


def top(keys: mx.array, m: int) -> tuple[mx.array, mx.array]:
    """(ids, keys) of the m highest keys of each row, highest first."""
    m = min(m, keys.shape[-1])
    if m == keys.shape[-1]:
        ids = mx.argsort(-keys, axis=-1)
    else:
        part = mx.argpartition(-keys, kth=m - 1, axis=-1)[..., :m]
        order = mx.argsort(-mx.take_along_axis(keys, part, axis=-1), axis=-1)
        ids = mx.take_along_axis(part, order, axis=-1)
    return ids, mx.take_along_axis(keys, ids, axis=-1)


Expand = Callable[[int, list[int], mx.array], mx.array]
"""expand(depth, inner nodes at that depth, their ids) -> (len(nodes), V) logits of their
children."""


def grow(shape: Shape, root_logits: mx.array, scorer: Scorer, expand: Expand) -> TreeDraft:
    """A tree of a fixed shape: candidates taken in the scorer's order, level by level."""
    keys, qs, cands, tokens = [], [], [], []
    width = max(shape.width, 1)

    def score(logits: mx.array, depth: int) -> None:
        k, q = scorer(logits, depth)
        keys.append(k)
        qs.append(q)
        cands.append(top(k, width)[0])

    score(root_logits, 0)
    for depth in range(1, shape.depth + 1):
        nodes = shape.level(depth)
        rows = mx.array([shape.rows[shape.parents[i] + 1] for i in nodes], mx.int32)
        ranks = mx.array([shape.ranks[i] for i in nodes], mx.int32)
        table = cands[0] if len(cands) == 1 else mx.concatenate(cands, axis=0)
        level = table[rows, ranks]
        tokens.append(level)
        inner = [i for i in nodes if shape.children[i + 1]]
        if inner:
            local = mx.array([i - nodes[0] for i in inner], mx.int32)
            score(expand(depth, inner, level[local]), depth)
    return TreeDraft(
        tokens=mx.concatenate(tokens).astype(mx.uint32),
        parents=mx.array(shape.parents, mx.int32),
        depths=mx.array(shape.depths, mx.int32),
        ranks=mx.array(shape.ranks, mx.int32),
        size=shape.size,
        depth=shape.depth,
        keys=mx.concatenate(keys, axis=0),
        row_of=mx.array(shape.rows, mx.int32),
        q=mx.concatenate(qs, axis=0) if qs[0] is not None else None,
        shape=shape,
    )


def ddtree(keys: mx.array, budget: int) -> TreeDraft:
    """DDTree's best-first tree over per-position log-probabilities `keys` (L, V) (of the
    drafter's marginals, or of log q + the coupled noise): the `budget` prefixes of highest
    summed score, found level by level on the device (each level keeps its `budget` best: no
    prefix of the best set is lost). Scores are capped at 0, so a child never outscores its
    parent and the best set is prefix-closed (a key above 0 would orphan nodes).
    """
    depth_count, vocab = keys.shape
    k = min(budget, vocab)
    ids, vals = top(keys, k)
    vals = mx.clip(vals, FLOOR, 0.0)
    scores, parents, tokens, ranks, depths = (
        [vals[0]],
        [mx.full((k,), -1, mx.int32)],
        [ids[0]],
        [mx.arange(k, dtype=mx.int32)],
        [mx.full((k,), 1, mx.int32)],
    )
    start, width = 0, k
    for d in range(1, depth_count):
        cand = (scores[-1][:, None] + vals[d][None, :]).reshape(-1)
        kept = min(budget, width * k)
        pick = mx.argpartition(-cand, kth=kept - 1)[:kept] if kept < width * k else mx.arange(kept)
        pick = pick.astype(mx.int32)
        scores.append(cand[pick])
        parents.append(start + pick // k)
        tokens.append(ids[d][pick % k])
        ranks.append(pick % k)
        depths.append(mx.full((kept,), d + 1, mx.int32))
        start, width = start + width, kept
    total = start + width
    n = min(budget, total)
    score, depth = mx.concatenate(scores), mx.concatenate(depths)
    tie = DEPTH_TIE * depth.astype(mx.float32)
    key = score * (1 + tie) - 0.1 * tie
    chosen = mx.argpartition(-key, kth=n - 1)[:n] if n < total else mx.arange(n)
    chosen = chosen.astype(mx.int32)
    # Level order, then the parents renumbered.
    chosen = chosen[mx.argsort(depth[chosen] * total + chosen)]
    renumber = mx.full((total,), -1, mx.int32)
    renumber[chosen] = mx.arange(n, dtype=mx.int32)
    old_parents = mx.concatenate(parents)[chosen]
    new_parents = mx.where(old_parents >= 0, renumber[mx.maximum(old_parents, 0)], -1)
    node_depths = depth[chosen]
    # Every node's children were ranked in its depth's row (a block scores each position once).
    row_of = mx.concatenate([mx.zeros((1,), mx.int32), node_depths])
    row_of = mx.where(row_of < depth_count, row_of, -1)
    return TreeDraft(
        tokens=mx.concatenate(tokens)[chosen].astype(mx.uint32),
        parents=new_parents,
        depths=node_depths,
        ranks=mx.concatenate(ranks)[chosen],
        size=n,
        depth=depth_count,
        keys=keys,
        row_of=row_of,
        grown="ddtree",
    )
