"""The verify-cost curve of `macspec bench`: what a target pass over m ids, a draft step and a
prompt lookup cost on this device, timed on warm caches between the benchmark's runs."""

from __future__ import annotations

import time
from collections.abc import Sequence
from statistics import median

import mlx.core as mx
import mlx.nn as nn

from macspec.bench.theory import CostCurve
from macspec.engine.caches.cached import CachedModel
from macspec.engine.drafters.lookup import LookupDrafter


def _filler(prompt_ids: Sequence[int], n: int) -> list[int]:
    return [prompt_ids[i % len(prompt_ids)] for i in range(n)]


LOOKUP_GUESS = 8
"""Ids a timed lookup proposes: a cycle's worth."""


class CostSampler:
    """Times target passes over m = 1..max_m ids, draft steps and lookups, on warm caches, a round
    at a time: the benchmark takes a round between prompts, so the curve sees the same drift
    of the machine as the runs (one burst at the start can catch a busy moment)."""

    DRAFT_STEPS = 3
    """Draft steps timed per round (each is short)."""

    def __init__(
        self, target: nn.Module, draft: nn.Module | None, prompt_ids: Sequence[int], max_m: int
    ):
        self.ids = _filler(prompt_ids, max_m)
        self.target = CachedModel(target, "target model")
        self.target.prefill(list(prompt_ids))
        self.draft = CachedModel(draft, "draft model") if draft is not None else None
        if self.draft is not None:
            self.draft.prefill(list(prompt_ids))
        self.target_s: dict[int, list[float]] = {m: [] for m in range(1, max_m + 1)}
        self.draft_s: list[float] = []
        # Prompt lookup on the prompt plus a repeat of its start, so every lookup finds a match
        self.lookup = LookupDrafter()
        self.lookup_context = [*prompt_ids, *prompt_ids[:LOOKUP_GUESS]]
        self.lookup_s: list[float] = []
        self.rounds = 0
        self.round(keep=False)  # the first round warms up and is dropped

    def _time(self, model: CachedModel, m: int) -> float:
        keep = len(model)
        model.checkpoint("timing")  # recurrent layers return here rather than trim
        mx.eval([c.state for c in model.cache])
        started = time.perf_counter()
        mx.eval(model.forward(self.ids[:m]))
        elapsed = time.perf_counter() - started
        model.trim_to(keep)
        return elapsed

    def round(self, keep: bool = True) -> None:
        """One timing of every m (rotated, so no m always follows the same one), of the draft
        and of a lookup."""
        sizes = list(self.target_s)
        shift = self.rounds % len(sizes)
        for m in [*sizes[shift:], *sizes[:shift]]:
            elapsed = self._time(self.target, m)
            if keep:
                self.target_s[m].append(elapsed)
        for _ in range(self.DRAFT_STEPS):
            if self.draft is not None:
                elapsed = self._time(self.draft, 1)
                if keep:
                    self.draft_s.append(elapsed)
            elapsed = self._time_lookup()
            if keep:
                self.lookup_s.append(elapsed)
        self.rounds += keep

    def _time_lookup(self) -> float:
        """Seconds per proposed id of one lookup. The index is rebuilt untimed before each, so
        the timed call pays what a cycle pays: indexing the ids that arrived, then the match."""
        self.lookup.start(self.lookup_context[:-LOOKUP_GUESS])
        started = time.perf_counter()
        found = self.lookup.match(self.lookup_context, LOOKUP_GUESS)
        elapsed = time.perf_counter() - started
        return elapsed / max(1, len(found.tokens) if found else 0)

    def curve(self) -> CostCurve:
        return CostCurve(
            tuple(median(t) for t in self.target_s.values()),
            median(self.draft_s) if self.draft_s else None,
            median(self.lookup_s),
        )
