"""How many tokens to guess next.

`FixedPolicy` always asks for k. `AutoPolicy` asks for the k that maximises expected tokens
per second, from what it measures on this device: the target's pass time over m tokens,
the draft's step time, and the acceptance rate at each draft position. Where speculation
does not pay (a CPU, where a pass over m tokens costs about m single passes), it settles on
k = 0, plain decoding, and probes now and then so it can switch back.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any, Protocol

from macspec.engine.core.events import Cycle
from macspec.engine.core.stats import Ema
from macspec.errors import MacspecError

if TYPE_CHECKING:  # sampling loads MLX; the light commands that read policies do not
    from macspec.engine.core.sampling import SamplingParams


class DraftPolicy(Protocol):
    """Chooses the draft length of each cycle and learns from its outcome. Policies subclass
    it to inherit its defaults: one that needs no engine, no per-temperature figures and no
    trees says nothing of them."""

    confidence_floor: float | None
    """Stop drafting before a guess the draft is less sure of than this (None: never)."""
    wants_timings: bool = True
    """Whether it prices drafting against verifying: then some cycles time them apart."""
    last_choice: int = 0
    """The draft length it chose last."""
    reason: str | None = None
    """`--draft auto`'s words on its choice of drafter (shown by the stats line)."""
    tree_note: str | None = None
    """Why this engine verifies chains only though trees were asked for."""

    def draft_length(self) -> int:
        """Tokens to guess in the next cycle; 0 means a plain target step."""

    def observe(self, cycle: Cycle) -> None:
        """Learn from a finished cycle."""

    def bind(self, engine: Any) -> None:
        """The engine it prices for is built (a tree policy checks that the target can verify
        trees). `engine` is the generate loop's Engine, above this room."""

    def begin(self, params: SamplingParams) -> None:
        """A generation at these sampling settings begins."""

    def tree_plan(self, k: int, context: list[int], greedy_or_coupled: bool) -> Any:
        """The tree (a `trees.propose.TreePlan`) to verify this cycle, or None: a chain."""
        return None

    def price_note(self) -> str | None:
        """Words for when the measured price says speculation loses here; None otherwise
        (or before both the guess and the plain pass are measured)."""
        return None

    def carry_from(self, learned: DraftPolicy) -> None:
        """Start from what a policy of the same kind measured (a batch's new row takes the
        figures of the row that finished last: rows come and go, the device and the drafters
        stay)."""


class FixedPolicy(DraftPolicy):
    """Always guess k tokens (mlx-lm's `--num-draft-tokens`)."""

    confidence_floor = None
    wants_timings = False
    """It never prices drafting against verifying: no probe cycle waits after drafting."""

    def __init__(self, k: int):
        if k < 1:
            raise MacspecError(f"--num-draft-tokens must be >= 1 (or 'auto'), got {k}")
        self.k = k

    def draft_length(self) -> int:
        return self.k

    def observe(self, cycle: Cycle) -> None:
        pass


class AutoPolicy(DraftPolicy):
    """Cost-aware draft length with a confidence stop.

    Expected tokens from a cycle of k guesses: E(k) = 1 + sum_j prod_{i<=j} a_i, where a_i is
    the chance the i-th guess is kept given the ones before were. Its cost:
    k * guess_cost + T(k + 1) + overhead, T(m) being a target pass over m tokens and
    guess_cost a draft model's step (next to nothing for a prompt-lookup guess).
    """

    def __init__(
        self,
        max_k: int = 8,
        confidence_floor: float | None = 0.4,
        start_k: int = 3,
        probe_every: int = 16,
        memory: float = 0.95,
    ):
        self.max_k = max_k
        self.confidence_floor = confidence_floor
        self.probe_every = probe_every
        self.memory = memory
        """Decay of the acceptance counts per observation, so estimates follow the text."""
        # Acceptance by position: decayed counts of guesses reached and kept (Beta(1, 1) prior).
        self._reached = [0.0] * (max_k + 1)
        self._kept = [0.0] * (max_k + 1)
        self._pass_time = {m: Ema(0.3) for m in range(1, max_k + 2)}
        self._draft_step = Ema(0.3)
        self._overhead = Ema(0.3)
        self._cycles = 0
        self._warmup = [start_k, 0]  # one pass of each shape before trusting the model
        self.last_choice = start_k
        """The draft length of the latest cycle (shown live by the UI)."""
        self._probe_interval = probe_every
        self._next_probe = probe_every
        self._settled: int | None = None
        self._probe_up = True
        self._best: int | None = None
        self._skipped = False

    def carry_from(self, learned: DraftPolicy) -> None:
        if type(learned) is type(self):
            self.__dict__.update(copy.deepcopy(learned.__dict__))

    def share_costs(self, other: AutoPolicy, of_the_draft: bool = True) -> None:
        """Use `other`'s estimates of what the target's passes cost (and, `of_the_draft`, a
        guess), kept in common from now on: they are the device's and the models', whichever
        drafter guesses and at any temperature (acceptance is neither)."""
        self._pass_time, self._overhead = other._pass_time, other._overhead
        if of_the_draft:
            self._draft_step = other._draft_step

    # -- estimates -------------------------------------------------------------------------
    def acceptance(self, position: int, optimistic: bool = False) -> float:
        """Chance the guess at `position` (1-based) is kept, given the ones before were.

        `optimistic` adds two standard deviations of the estimate: what it might still be.
        """
        for i in range(position, 0, -1):  # unseen deep positions borrow the deepest seen
            if self._reached[i] >= 1:
                n = self._reached[i] + 2
                mean = (self._kept[i] + 1) / n
                if optimistic:
                    return min(1.0, mean + 2 * (mean * (1 - mean) / n) ** 0.5)
                return mean
        return 1.0 if optimistic else 0.5

    @property
    def guess_cost(self) -> float:
        """Measured seconds of drafting one guess (0 until measured)."""
        return self._draft_step.value or 0.0

    def pass_time(self, m: int) -> float | None:
        """Estimated seconds of a target pass over m tokens: measured, else a linear fit."""
        measured = {n: e.value for n, e in self._pass_time.items() if e.value is not None}
        if m in measured:
            return measured[m]
        if len(measured) < 2:
            return None
        xs, ys = list(measured), list(measured.values())
        mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
        var = sum((x - mean_x) ** 2 for x in xs)
        slope = max(0.0, sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / var)
        return max(1e-9, mean_y + slope * (m - mean_x))

    def expected_rate(self, k: int, optimistic: bool = False) -> float | None:
        """Expected tokens per second of a cycle of k guesses."""
        verify = self.pass_time(k + 1)
        if verify is None or (k and self._draft_step.value is None):
            return None
        tokens, chain = 1.0, 1.0
        for i in range(1, k + 1):
            chain *= self.acceptance(i, optimistic)
            tokens += chain
        cost = verify + k * (self._draft_step.value or 0.0) + (self._overhead.value or 0.0)
        return tokens / cost

    def best_k(self) -> int | None:
        rates = {k: self.expected_rate(k) for k in range(self.max_k + 1)}
        known = {k: r for k, r in rates.items() if r is not None}
        return max(known, key=known.__getitem__) if known else None

    def could_pay(self) -> bool:
        """Whether speculation might beat plain decoding if acceptance is as high as it may be."""
        plain = self.expected_rate(0)
        if plain is None:
            return True
        rates = (self.expected_rate(k, optimistic=True) for k in range(1, self.max_k + 1))
        return any(rate is None or rate > plain for rate in rates)

    def price_note(self) -> str | None:
        # The verdict `could_pay` gives a probe: at the draft's measured cost per guess and the
        # target's per pass, not even the acceptance the figures still allow beats plain steps.
        plain, one = self.expected_rate(0), self.pass_time(1)
        if plain is None or one is None or self._draft_step.value is None or self.could_pay():
            return None
        reached = sum(self._kept[1:]) / max(1e-9, sum(self._reached[1:]))
        best = max(self.expected_rate(k) or 0.0 for k in range(1, self.max_k + 1))
        return (
            f"speculation loses here at the measured prices: a guess costs "
            f"{self.guess_cost / one:.2f} of a target pass, and at {reached:.0%} of guesses "
            f"kept the best draft length makes {best:.1f} tok/s against {plain:.1f} plain"
        )

    # -- the policy interface ----------------------------------------------------------------
    def draft_length(self) -> int:
        self._cycles += 1
        if self._warmup:
            choice = self._warmup.pop(0)
        else:
            if self._best is None or self._cycles % 4 == 0 or self.last_choice:
                self._best = self.best_k()  # refreshed every few plain steps: it is costly
            best = self._best
            choice = self.last_choice if best is None else best
            due = self._cycles >= self._next_probe
            if due and best == 0 and not self._skipped and not self.could_pay():
                # Not even the most optimistic acceptance would pay at the measured costs: skip
                # this probe, and probe much later in case the device or the text changes.
                self._skipped = True
                self._next_probe = self._cycles + 8 * self.probe_every
            elif due:
                self._skipped = False
                choice = self._neighbour(choice)
                # A probe costs time where it is not the best choice: space probes out while
                # they keep confirming the same choice, and tighten again when it moves.
                if best == self._settled:
                    self._probe_interval = min(2 * self._probe_interval, 8 * self.probe_every)
                else:
                    self._probe_interval = self.probe_every
                self._settled = best
                self._next_probe = self._cycles + self._probe_interval
        self.last_choice = choice
        return choice

    def _neighbour(self, k: int) -> int:
        """A draft length next to k, alternating up and down, to keep estimates fresh."""
        if k == 0:
            return 2  # two guesses: acceptance at two depths from one probe
        self._probe_up = not self._probe_up
        return min(self.max_k, k + 1) if self._probe_up else k - 1

    def observe(self, cycle: Cycle) -> None:
        if cycle.timed:  # probe cycles time drafting and verifying apart; others wait once
            self._observe_times(cycle)
        else:
            self._observe_whole(cycle)
        for i in range(1, cycle.proposed + 1):
            self._reached[i] = self._reached[i] * self.memory + 1
            self._kept[i] = self._kept[i] * self.memory + (1 if i <= cycle.accepted else 0)
            if i > cycle.accepted:
                break  # later guesses were never judged

    def _observe_whole(self, cycle: Cycle) -> None:
        """A cycle timed only whole (one wait): its pass is what is left of its time once its
        guesses are priced as the probes measured them. So the target's cost at each m is
        learned on every cycle, without a wait of its own."""
        step = self._draft_step.value
        if step is None or cycle.draft_fed > cycle.draft_steps + 1:
            return  # no price for a guess yet, or a catch-up step of unknown cost
        m = cycle.fed or cycle.proposed + 1
        verify = cycle.verify_s - step * max(cycle.draft_steps, cycle.proposed)
        if verify > 0:
            self._pass_time[min(m, self.max_k + 1)].add(verify)

    def _observe_times(self, cycle: Cycle) -> None:
        # A pass over m ids: the guesses and the ids before them (more after a restore).
        m = cycle.fed or cycle.proposed + 1
        self._pass_time[min(m, self.max_k + 1)].add(cycle.verify_s)
        self._overhead.add(cycle.overhead_s)
        if cycle.requested and cycle.draft_fed <= cycle.draft_steps + 1:
            # Cost per guess: a model's forward step, or next to nothing for a lookup.
            self._draft_step.add(cycle.draft_s / max(cycle.draft_steps, cycle.proposed, 1))
        elif cycle.requested and cycle.draft_steps:
            # A catch-up: the first step also fed the ids the drafter missed (plain steps, or
            # under --draft auto another drafter's cycles, which may be all a runner-up ever
            # drafts after). Price that step as the target's pass over as many ids, relative
            # to one (the same device; about m on a CPU, until a plain step has been timed),
            # rather than leave the drafter unpriced, and so never chosen.
            first = cycle.draft_fed - cycle.draft_steps + 1
            one, catch_up = self.pass_time(1), self.pass_time(first)
            relative = catch_up / one if one and catch_up else first
            self._draft_step.add(cycle.draft_s / (cycle.draft_steps - 1 + relative))


TREE_SIZES = (2, 256)
"""`--draft-tree N`: the fewest and most nodes of a tree."""


def tree_size(spec: str | int | None) -> int | str | None:
    """`--draft-tree`: a number of nodes, 'auto', or None for 'off' (and for no flag)."""
    if spec is None:
        return None
    text = str(spec).strip().lower()
    if text in ("off", "auto"):
        return None if text == "off" else "auto"
    low, high = TREE_SIZES
    if not (text.isdigit() and low <= int(text) <= high):
        raise MacspecError(
            f"--draft-tree must be a number of nodes from {low} to {high}, 'auto' or 'off', "
            f"got {spec!r}"
        )
    return int(text)


def make_policy(spec: str | int, max_k: int = 8) -> DraftPolicy:
    """'auto' or a positive integer, as given to --num-draft-tokens."""
    if isinstance(spec, str) and spec.strip().lower() == "auto":
        return AutoPolicy(max_k=max_k)
    try:
        k = int(spec)
    except (TypeError, ValueError):
        raise MacspecError(
            f"--num-draft-tokens must be a positive integer or 'auto', got {spec!r}"
        ) from None
    return FixedPolicy(k)
