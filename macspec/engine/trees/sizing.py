"""`--draft-tree N|auto|off`: whether a cycle verifies a tree or a chain, and which tree.

The tree's shape comes from what is measured, not from what the drafter says of itself:
acceptance by depth and by candidate rank (`RankStats`), from every cycle. A greedy or coupled
cycle tells where the target's token ranked in the drafter's order where the walk stopped,
so chains teach what a tree would have kept too. `best_first` then grows the tree of N nodes
with the most expected kept guesses (its nodes' values add up).

`N` verifies trees of at most N nodes (a draft-length policy still says when to guess at all,
and how deep); `auto` prices every choice on this device: plain decoding, the chain of the
draft-length policy, and trees of 4, 8, 16, 32 and 64 nodes, each by expected tokens per second
from the measured cost of a target pass over m ids and the measured acceptance by rank. A tree
size not timed yet is priced by extrapolating the pass-cost curve, and tried once when it
might pay.
"""

from __future__ import annotations

from copy import deepcopy
from dataclasses import replace

from macspec.engine.caches import tree_attention as treeattn
from macspec.engine.core.cycle import Cycle
from macspec.engine.core.stats import Ema
from macspec.engine.policy.length import DraftPolicy, tree_size
from macspec.engine.trees import propose as treedraft
from macspec.engine.trees.propose import TreePlan
from macspec.engine.trees.ranks import Growth, RankStats
from macspec.engine.trees.shapes import Shape, best_first, expected_kept

AUTO_BUDGETS = (4, 8, 16, 32, 64)
"""Tree sizes `auto` prices."""
RESHAPE_EVERY = 4
"""Cycles between recomputations of the best shape from the acceptance measured."""
DEFAULT_DEPTH = 8
"""How deep `auto` lets a tree grow when the drafter does not bound it."""


class TreePolicy(DraftPolicy):
    """A draft-length policy with trees: it asks `inner` when and how deep to guess, and
    decides whether the cycle verifies a tree, of which shape."""

    def __init__(self, inner: DraftPolicy, budget: int | None, max_budget: int = 64):
        self.inner = inner
        self.budget = budget
        """Most nodes per tree; None: `auto`."""
        self.budgets = tuple(b for b in AUTO_BUDGETS if b <= max_budget)
        self.stats: dict[str, RankStats] = {}
        self.note: str | None = None
        """Why this engine verifies chains only (shown in the stats), None while trees run."""
        self._engine = None
        self._recurrent = False
        self._drafter_note: str | None = None
        self._checked = False
        self._chosen: int | None = None  # auto: the tree size chosen for the coming cycle
        self.priced_outside = False
        """A batch's row: the batch prices `auto`'s tree size on its shared pass (`assign`)."""
        self._pass_time: dict[int, Ema] = {}
        self._draft_step: dict[str, Ema] = {}
        self._overhead = Ema(0.3)
        self._tree_time: dict[int, Ema] = {}
        """Seconds of a whole tree cycle (drafting, the pass, the verdict), by tree size: every
        tree cycle gives it, a probe or not."""
        self._cycles = 0
        self.last_tree = 0
        """Nodes of the latest cycle's tree (0: a chain or a plain step), for the UI."""
        self.growth = Growth()
        """A block drafter's trees, greedy or coupled: DDTree's or the measured shape."""
        self._shapes: dict[tuple[str, int, int], Shape] = {}
        self._observed = 0
        self._drafter_reasons: dict[int, str | None] = {}

    # -- the draft-length policy's interface, delegated ------------------------------------
    @property
    def confidence_floor(self) -> float | None:
        return self.inner.confidence_floor

    @property
    def wants_timings(self) -> bool:
        return self.budget is None or self.inner.wants_timings

    @property
    def last_choice(self) -> int:
        return self.inner.last_choice

    @property
    def reason(self) -> str | None:  # --draft auto's words on its choice
        return self.inner.reason

    def price_note(self) -> str | None:
        return self.inner.price_note()

    def bind(self, engine, checked: tuple[str | None, bool] | None = None) -> None:
        """Check once that the engine's target can verify trees; `checked`: (the note why not,
        or None; whether recurrent layers branch) from an engine that checked its own passes
        (a batch: `engine` is the row)."""
        self._engine = engine
        if checked is not None:
            (self.note, self._recurrent), self._checked = checked, True
            self.priced_outside = True
            return
        target = engine.target
        self._recurrent = treeattn.branches_recurrent(target.model, target.cache)
        why = treeattn.tree_ready(target.model, target.cache)
        if why is not None:
            self.note = f"tree off: the target {why}; chains"

    def carry_from(self, learned: DraftPolicy) -> None:
        if isinstance(learned, TreePolicy):  # a batch's new row: the measured ranks and costs
            self.inner.carry_from(learned.inner)
            self.stats = {name: deepcopy(ranks) for name, ranks in learned.stats.items()}

    def draft_length(self) -> int:
        k = self.inner.draft_length()
        self._cycles += 1
        self._chosen = None
        if self.budget is None and not self.priced_outside and self._tree_possible():
            self._chosen = self._auto_choice(k)
            if self._chosen is not None:
                shape = self._shape(self._chosen, self._depth_bound(k))
                return max(shape.depth, 1)
        return k

    def observe(self, cycle: Cycle) -> None:
        self.last_tree = cycle.tree.nodes if cycle.tree is not None else 0
        self._observed += 1
        if self._observed % RESHAPE_EVERY == 0:
            self._shapes.clear()
        if cycle.requested or cycle.proposed:
            self.stats.setdefault(cycle.draft_source or "model", RankStats()).observe(cycle)
        if cycle.timed:
            self._observe_times(cycle)
        if cycle.tree is not None:
            seconds = cycle.draft_s + cycle.verify_s + cycle.overhead_s
            self._tree_time.setdefault(cycle.tree.nodes, Ema(0.3)).add(seconds)
        if cycle.tree is not None and treedraft.max_depth(self._engine.drafter) is not None:
            self.growth.add(cycle.tree.grown, cycle.accepted)
        if cycle.tree is not None:  # the draft-length policy learns the chain it holds
            tree = cycle.tree
            run = next((i for i, r in enumerate(tree.path_ranks) if r), len(tree.path_ranks))
            cycle = replace(
                cycle, proposed=min(run + 1, cycle.requested), accepted=run, timed=False, tree=None
            )
        self.inner.observe(cycle)

    # -- trees -------------------------------------------------------------------------------
    def tree_plan(self, k: int, context: list[int], greedy_or_coupled: bool) -> TreePlan | None:
        """The tree to grow this cycle after `context`, guessing at most k deep; None: a chain."""
        if k < 1 or not self._tree_possible(context):
            return None
        depth = self._depth_bound(k)
        budget = self._chosen if self.budget is None else self.budget
        if budget is None or budget <= depth:
            return None
        drafter = treedraft.tree_drafter(self._engine.drafter)
        if greedy_or_coupled and treedraft.max_depth(drafter) is not None and self._ddtree_next():
            return TreePlan(None, budget, depth)
        shape = self._shape(budget, depth)
        return None if shape.is_chain() else TreePlan(shape, budget, depth)

    @property
    def tree_note(self) -> str | None:
        """Why trees were not verified, when they could not be (else None)."""
        return self.note or self._drafter_note

    def _ddtree_next(self) -> bool:
        """A block drafter's next tree: DDTree over its own marginals, or the measured shape,
        whichever has kept more guesses per tree on this request (`Growth`)."""
        if self._recurrent:  # recurrent layers need the tree's shape on the host
            return False
        return self.growth.ddtree_next()

    def _tree_possible(self, context: list[int] | None = None) -> bool:
        if self.note is not None or self._engine is None:
            return False
        drafter = treedraft.tree_drafter(self._engine.drafter)
        if id(drafter) not in self._drafter_reasons:  # asked once per drafter: it walks modules
            why = treedraft.no_tree_reason(drafter) if drafter is not None else "no drafter"
            self._drafter_reasons[id(drafter)] = why
        why = self._drafter_reasons[id(drafter)]
        if why is not None:
            if drafter is self._engine.drafter:  # not one of --draft auto's candidates
                self._drafter_note = f"tree off: {why}; chains"
            return False
        if not self._checked and context is not None and len(context) >= 3:
            self._checked = True
            target = self._engine.target
            fresh = target.options.make(target.model)
            why = treeattn.check_tree_pass(target.model, fresh, context[-3:])
            if why is not None:
                self.note = f"tree off: {why}; chains"
                return False
        return True

    def _depth_bound(self, k: int) -> int:
        bound = treedraft.max_depth(self._engine.drafter)
        deepest = k if self.budget is not None else max(k, DEFAULT_DEPTH)
        return min(deepest, bound) if bound is not None else deepest

    def _accept(self) -> list[list[float]]:
        source = treedraft.tree_drafter(self._engine.drafter).name
        return self.stats.setdefault(source, RankStats()).accept()

    def _shape(self, budget: int, depth: int) -> Shape:
        """The best shape under the acceptance measured (recomputed every `RESHAPE_EVERY`
        cycles: the estimates move slowly, and a cycle should not wait on the host)."""
        source = treedraft.tree_drafter(self._engine.drafter).name
        key = (source, budget, depth)
        if key not in self._shapes:
            self._shapes[key] = best_first(self._accept(), budget, depth)
        return self._shapes[key]

    # -- a batch's pricing (engine/batch/pricing.py) ----------------------------------------
    def options(self, k: int) -> list[tuple[int, int, float, float]]:
        """`auto`'s choices after the draft length k, as (nodes: 0 for the chain, ids fed,
        expected tokens, drafting seconds): the chain, then each tree size it prices."""
        if k < 1 or self.budget is not None or not self._tree_possible():
            return []
        depth, accept = self._depth_bound(k), self._accept()
        step = self._draft_step.get(treedraft.tree_drafter(self._engine.drafter).name)
        seconds = step.value if step is not None and step.value is not None else 0.0
        block = treedraft.max_depth(self._engine.drafter) is not None
        chain = Shape.chain(k)
        choices = [(0, k, 1.0 + expected_kept(chain, accept), seconds * (1 if block else k))]
        for budget in self.budgets:
            if budget > depth:
                shape = self._shape(budget, depth)
                steps = 1 if block else shape.depth
                tokens = 1.0 + expected_kept(shape, accept)
                choices.append((budget, shape.size, tokens, seconds * steps))
        return choices

    def assign(self, nodes: int) -> None:
        """The batch's choice for the coming cycle: a tree of `nodes` (0: the chain)."""
        self._chosen = nodes or None

    # -- auto: pricing ------------------------------------------------------------------------
    def _observe_times(self, cycle: Cycle) -> None:
        m = cycle.fed or cycle.proposed + 1
        self._pass_time.setdefault(m, Ema(0.3)).add(cycle.verify_s)
        self._overhead.add(cycle.overhead_s)
        if cycle.proposed and cycle.draft_steps:
            self._draft_step.setdefault(cycle.draft_source or "model", Ema(0.3)).add(
                cycle.draft_s / cycle.draft_steps
            )

    def pass_time(self, m: int) -> float | None:
        """A target pass over m ids: measured, else interpolated, else extrapolated from the
        two largest measured (never below the largest measured)."""
        known = sorted((n, e.value) for n, e in self._pass_time.items() if e.value is not None)
        if not known:
            return None
        for (m0, t0), (m1, t1) in zip(known, known[1:]):
            if m0 <= m <= m1:
                return t0 + (t1 - t0) * (m - m0) / (m1 - m0)
        if m < known[0][0]:
            return known[0][1]
        if len(known) == 1:
            return None
        (m0, t0), (m1, t1) = known[-2], known[-1]
        return max(t1, t1 + (t1 - t0) / (m1 - m0) * (m - m1))

    def expected_rate(self, shape: Shape | None, tree: bool = False) -> float | None:
        """Tokens per second of a cycle verifying `shape` (None: a plain step); a tree's cost
        is what cycles with trees of its size took, once there were some."""
        source = treedraft.tree_drafter(self._engine.drafter).name
        size = shape.size if shape is not None else 0
        tokens = 1.0 + (expected_kept(shape, self._accept()) if size else 0.0)
        measured = self._tree_time.get(size) if tree else None
        if measured is not None and measured.value is not None:
            return tokens / measured.value
        verify = self.pass_time(1 + size)
        step = self._draft_step.get(source)
        if verify is None or (size and (step is None or step.value is None)):
            return None
        steps = 0 if not size else (1 if treedraft.max_depth(self._engine.drafter) else shape.depth)
        cost = verify + steps * (step.value if size else 0.0) + (self._overhead.value or 0.0)
        return tokens / cost

    def _auto_choice(self, k: int) -> int | None:
        """The tree size that promises the most tokens per second, if it beats the chain the
        draft-length policy chose (or plain decoding); None: the chain (or plain)."""
        depth = self._depth_bound(k)
        baseline = self.expected_rate(Shape.chain(k) if k else None)
        if baseline is None:
            return None
        best, best_rate = None, baseline
        for budget in self.budgets:
            if budget <= depth:
                continue
            shape = self._shape(budget, depth)
            rate = self.expected_rate(shape, tree=True)
            if rate is None:
                continue
            untried = shape.size not in self._tree_time
            if rate > best_rate or (untried and rate > 0.8 * baseline and best is None):
                best, best_rate = budget, max(rate, best_rate)
        return best


def make_tree_policy(spec: str | int | None, inner: DraftPolicy) -> DraftPolicy:
    """`--draft-tree`: 'off' (or None) keeps `inner`; a number of nodes, or 'auto'."""
    size = tree_size(spec)
    if size is None:
        return inner
    return TreePolicy(inner, None if size == "auto" else size)
