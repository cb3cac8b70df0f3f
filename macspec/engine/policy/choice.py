"""`--draft auto`: the drafter is chosen by measurement, on this device, cycle by cycle.

Each candidate (a draft model, an MTP head, a DFlash drafter, prompt lookup) keeps its own
cost-aware draft-length policy (`AutoPolicy`): measured verify passes, its own draft cost, its
own acceptance by position. A cycle drafts with the candidate whose best draft length promises
the most tokens per second; the others are probed now and then so their figures stay fresh, and
when none beats plain decoding, the cycle is a plain step. Every candidate follows the committed
text (start, rollback, hidden states), so any of them can take over at the next cycle.

Acceptance is kept per temperature (the engine says each generation's, through `begin`): a
draft distilled on greedy answers may be the best guesser at T = 0 and the worst when sampling,
so an engine that serves both (a server) measures and picks for each apart. What passes and
guesses cost is the device's, shared by every temperature.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

from macspec.engine.caches.cached import CachedModel
from macspec.engine.core.cycle import Cycle
from macspec.engine.core.sampling import Draws, SamplingParams
from macspec.engine.core.taps import Hidden, HiddenSpec
from macspec.engine.drafters.protocol import Draft, Drafter
from macspec.engine.policy.length import AutoPolicy, DraftPolicy


class DrafterChoice(Drafter, DraftPolicy):
    """Several drafters behind one; also the engine's draft-length policy (see `policy`)."""

    name = "auto"

    def __init__(self, drafters: Sequence[Drafter], probe_every: int = 24, max_k: int = 8):
        if not drafters:
            raise ValueError("DrafterChoice needs at least one drafter")
        self.drafters = {d.name: d for d in drafters}
        if len(self.drafters) < len(drafters):
            raise ValueError("DrafterChoice needs drafters of distinct names")
        self.max_k = max_k
        self.probe_every = probe_every
        self._cycles = 0
        self.temperature = 0.0
        """The temperature the figures in use were measured at."""
        self._others: dict[float, tuple] = {}  # the figures of the other temperatures
        self.policies: dict[str, AutoPolicy] = {}
        self._fresh()
        needs = [d.needs for d in drafters if d.needs is not None]
        self.needs: HiddenSpec | None = None
        for spec in needs:
            self.needs = spec if self.needs is None else self.needs.union(spec)
        self.confidence_floor = None

    def _fresh(self) -> None:
        before = self.policies  # the same drafters at another temperature
        self.policies = {name: AutoPolicy(max_k=self.max_k) for name in self.drafters}
        first = next(iter(self.policies.values()))
        for name, policy in self.policies.items():
            if name in before:  # a device's costs hold at any temperature
                policy.share_costs(before[name])
            elif policy is not first:  # one target: one estimate of its passes, for a fair race
                policy.share_costs(first, of_the_draft=False)
        self.current = next(iter(self.drafters))
        """The candidate drafting the coming cycle."""
        self.reason = "measuring"
        """Why the current pick: shown by the stats line, --json and the chat."""
        self._unmeasured = list(self.drafters)  # each is tried once before any comparison

    def carry_from(self, learned: DraftPolicy) -> None:
        if (
            not isinstance(learned, DrafterChoice)
            or learned.drafters.keys() != self.drafters.keys()
        ):
            return
        self.policies, self._others = copy.deepcopy((learned.policies, learned._others))
        self.temperature, self.current = learned.temperature, learned.current
        self.reason, self._unmeasured = learned.reason, list(learned._unmeasured)

    def begin(self, params: SamplingParams) -> None:
        """A generation at `params.temperature` begins: its own figures from now on (those of
        the temperature before are kept for when it comes back)."""
        if params.temperature == self.temperature:
            return
        state = (self.policies, self.current, self.reason, self._unmeasured)
        self._others[self.temperature] = state
        self.temperature = params.temperature
        if self.temperature in self._others:
            state = self._others.pop(self.temperature)
            self.policies, self.current, self.reason, self._unmeasured = state
        else:
            self._fresh()

    # -- the policy side -----------------------------------------------------------------------
    def rates(self) -> dict[str, tuple[float, int]]:
        """Each measured candidate's best (expected tokens per second, k) when it guesses."""
        rates = {}
        for name, policy in self.policies.items():
            known = [(r, k) for k in range(1, policy.max_k + 1) if (r := policy.expected_rate(k))]
            if known:
                rates[name] = max(known)
        return rates

    def draft_length(self) -> int:
        self._cycles += 1
        while self._unmeasured:  # each warms up in turn, the next one as soon as one is done
            self.current = self._unmeasured[0]
            if self.policies[self.current]._warmup:
                return self._ask(self.current)
            self._unmeasured.pop(0)
        rates = self.rates()
        if rates:
            ranked = sorted(rates, key=rates.__getitem__, reverse=True)
            self.current = ranked[0]
            if len(ranked) > 1 and self._cycles % self.probe_every == 0:
                self.current = ranked[1]  # a probe keeps the runner-up's figures fresh
            plain = max(p.expected_rate(0) or 0.0 for p in self.policies.values())
            expected = ", ".join(f"{n} {rates[n][0]:.0f} at k={rates[n][1]}" for n in ranked)
            if rates[ranked[0]][0] > plain:
                self.reason = f"{ranked[0]}: expected tok/s {expected}, plain {plain:.0f}"
            else:  # the chosen candidate's own policy then decodes plainly, probing now and then
                self.reason = (
                    f"plain: guessing does not pay on this device (expected tok/s {expected}, "
                    f"plain {plain:.0f})"
                )
        return self._ask(self.current)

    def _ask(self, name: str) -> int:
        k = self.policies[name].draft_length()
        self.confidence_floor = self.policies[name].confidence_floor
        return k

    @property
    def last_choice(self) -> int:
        return self.policies[self.current].last_choice

    def observe(self, cycle: Cycle) -> None:
        if cycle.proposed or cycle.requested:
            self.policies[cycle.draft_source or self.current].observe(cycle)
            return
        # A plain step's time informs them all, through the estimate of the target's passes
        # they share: counted once.
        next(iter(self.policies.values())).observe(cycle)

    # -- the drafter side ----------------------------------------------------------------------
    def start(self, prompt: Sequence[int]) -> None:
        for drafter in self.drafters.values():
            drafter.start(prompt)

    def rollback(self, keep: int) -> None:
        for drafter in self.drafters.values():
            drafter.rollback(keep)

    def caches(self) -> list[CachedModel]:
        found: list[CachedModel] = []  # candidates may share a model (hybrid and model)
        for drafter in self.drafters.values():
            found += [c for c in drafter.caches() if all(c is not f for f in found)]
        return found

    def active(self) -> Drafter:
        return self.drafters[self.current]

    def add_hidden(self, start: int, hidden: Hidden) -> None:
        for drafter in self.drafters.values():
            if drafter.needs is not None:
                drafter.add_hidden(start, hidden)

    def propose(
        self,
        context: Sequence[int],
        k: int,
        params: SamplingParams,
        draws: Draws | None,
        confidence_floor: float | None,
    ) -> Draft:
        return self.drafters[self.current].propose(context, k, params, draws, confidence_floor)
