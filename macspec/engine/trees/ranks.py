"""What a tree policy measures (`sizing.py`): acceptance by depth and candidate rank, from
every cycle, and which way of growing a block drafter's trees keeps more."""

from __future__ import annotations

from macspec.engine.core.cycle import Cycle

RANKS = 8
"""Candidate ranks tracked per depth (a tree asks for no more children than this)."""
DEPTHS = 16
"""Depths tracked (deeper ones borrow the deepest seen)."""
PROBE_GROWTH = 16
"""A block drafter's trees: every this many, the way of growing them that keeps fewer guesses
is tried again (the figures stay fresh)."""
MIN_TRIES = 4
"""A block drafter's trees: each way of growing them is tried this many times, DDTree first,
before the guesses they kept choose between them."""


class RankStats:
    """Decayed counts, per depth and rank: how often the target's token was that candidate,
    out of the times it was not an earlier one (Beta priors: rank 0 even, others unlikely)."""

    def __init__(self, memory: float = 0.98):
        self.memory = memory
        self.tries = [[0.0] * RANKS for _ in range(DEPTHS)]
        self.hits = [[0.0] * RANKS for _ in range(DEPTHS)]
        self.seen = [0.0] * DEPTHS

    def _count(self, depth: int, rank: int | None, tried: int) -> None:
        """At `depth` (1-based): ranks below `tried` were tried, `rank` was the target's."""
        if depth > DEPTHS:
            return
        tries, hits = self.tries[depth - 1], self.hits[depth - 1]
        self.seen[depth - 1] = self.seen[depth - 1] * self.memory + 1
        for r in range(RANKS):
            tries[r] *= self.memory
            hits[r] *= self.memory
        for r in range(min(tried, RANKS)):
            tries[r] += 1
        if rank is not None and rank < RANKS:
            hits[rank] += 1

    def observe(self, cycle: Cycle) -> None:
        """Learn from a chain or tree cycle."""
        tree = cycle.tree
        if tree is None:  # a chain: the rank-0 candidate, kept up to `accepted`
            for depth in range(1, cycle.accepted + 1):
                self._count(depth, 0, 1)
            if cycle.accepted < cycle.proposed:
                self._count(cycle.accepted + 1, None, 1)
            return
        for depth, rank in enumerate(tree.path_ranks, start=1):
            self._count(depth, rank, rank + 1)
        stop = len(tree.path_ranks) + 1
        if tree.stop_rank is not None:  # greedy or coupled: the target's token's true rank
            self._count(stop, tree.stop_rank, tree.stop_rank + 1)
        elif tree.stop_children:  # the rejection rule: the stop node's candidates all failed
            self._count(stop, None, tree.stop_children)

    def accept(self) -> list[list[float]]:
        """accept[d][r]: the chance the candidate of rank r is the one kept at depth d + 1."""
        table, last = [], None
        for depth in range(DEPTHS):
            if self.seen[depth] < 1 and last is not None:
                table.append(last)  # unseen depths borrow the deepest seen
                continue
            row, left = [], 1.0
            for r in range(RANKS):
                prior = (1.0, 1.0) if r == 0 else (0.5, 1.5)
                c = (self.hits[depth][r] + prior[0]) / (self.tries[depth][r] + sum(prior))
                row.append(left * c)
                left *= 1 - c
            table.append(row)
            last = row
        return table


class Growth:
    """How a block drafter's trees are grown, greedy or coupled: DDTree over the block's own
    marginals, or the shape measured by rank. Chosen by the guesses each kept per tree on the
    running request (decayed means over each way's own trees), after `MIN_TRIES` of each,
    taken in turn, DDTree first; the one that kept fewer is tried again every `PROBE_GROWTH`-th
    tree. No fixed preference: a tie goes to DDTree, the reference's construction."""

    WAYS = ("ddtree", "shape")

    def __init__(self, memory: float = 0.95):
        self.memory = memory
        self.kept = dict.fromkeys(self.WAYS, 0.0)
        self.weight = dict.fromkeys(self.WAYS, 0.0)
        self.planned = dict.fromkeys(self.WAYS, 0)
        self.trees = 0

    def add(self, grown: str, kept: int) -> None:
        """A tree grown that way kept `kept` guesses."""
        self.kept[grown] = self.kept[grown] * self.memory + kept
        self.weight[grown] = self.weight[grown] * self.memory + 1

    def mean(self, grown: str) -> float | None:
        """Guesses kept per tree grown that way, None before one was."""
        return self.kept[grown] / self.weight[grown] if self.weight[grown] else None

    def ddtree_next(self) -> bool:
        """Whether the next tree is DDTree's (else the measured shape's)."""
        self.trees += 1
        ddtree, shape = (self.planned[w] for w in self.WAYS)
        if min(ddtree, shape) < MIN_TRIES or None in (self.mean("ddtree"), self.mean("shape")):
            pick = ddtree <= shape
        else:
            better = self.mean("ddtree") >= self.mean("shape")
            pick = better != (self.trees % PROBE_GROWTH == 0)
        self.planned["ddtree" if pick else "shape"] += 1
        return pick
