"""Live figures of an answer while it streams, counted the way `Stats` counts them.

The worker feeds every engine event in; the UI gets immutable `Figures` snapshots. Rates are
cumulative over the answer (tokens after the first over the time after the first, as
`Stats.decode_tokens_per_s`), never per chunk, so they do not jump with batching.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from macspec.engine.core.events import Cycle, Done, Token
from macspec.engine.core.stats import Stats, sources_line


@dataclass(frozen=True)
class Figures:
    """What the stats bar shows about the answer in progress (or the last one)."""

    tokens: int = 0
    """Tokens generated so far."""
    decode_tokens_per_s: float | None = None
    """Cumulative decode rate; None before the second token."""
    acceptance_rate: float | None = None
    """Share of guesses the target kept; None while nothing was proposed."""
    proposed: int = 0
    """Guesses proposed so far (what acceptance is a share of)."""
    tokens_per_pass: float | None = None
    """Tokens per target pass so far."""
    draft_length: int | None = None
    """Guesses the policy asked for in the latest cycle (0: a plain step)."""
    ttft_s: float | None = None
    """Seconds to the first token; None before it."""
    sources: str | None = None
    """Acceptance by source of guesses (`sources_line`); None while a draft model drafts alone."""
    acceptance_history: tuple[float, ...] = ()
    """Per cycle that proposed guesses: the share kept (for the sparkline)."""
    finished: bool = False
    """True once the answer's Done was seen (the figures are then the engine's own)."""


class LiveFigures:
    """Counts one answer's events into Figures."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self._clock = clock
        self._started = clock()
        self._stats = Stats()
        self._first_at: float | None = None
        self._last_at: float | None = None
        self._first_pass = 0  # the target pass that brought the first token
        self._history: list[float] = []
        self._draft_length: int | None = None
        self._drafted_length = 0  # the latest draft length that asked for guesses
        self._done: Done | None = None

    def add(self, event: object) -> None:
        if isinstance(event, Cycle):
            self._stats.add_cycle(event)
            self._draft_length = event.requested
            self._drafted_length = event.requested or self._drafted_length
            if event.proposed:
                self._history.append(event.accepted / event.proposed)
        elif isinstance(event, Token):
            now = self._clock()
            if self._first_at is None:
                self._first_at, self._first_pass = now, self._stats.target_passes
            elif self._stats.target_passes != self._first_pass:
                self._stats.steady_tokens += 1  # as the engine counts: not the first pass's
            self._last_at = now
            self._stats.generated_tokens += 1
        elif isinstance(event, Done):
            self._done = event

    def figures(self) -> Figures:
        done = self._done
        if done is not None:  # the engine's exact counts
            stats, started = done.stats, done.stats.generated_tokens > 0
        else:
            stats, started = self._stats, self._first_at is not None
            if started:
                stats.ttft_s = self._first_at - self._started
                stats.decode_s = (self._last_at or self._first_at) - self._first_at
        return Figures(
            tokens=stats.generated_tokens,
            decode_tokens_per_s=stats.decode_tokens_per_s,
            acceptance_rate=stats.acceptance_rate,
            proposed=stats.draft_proposed,
            tokens_per_pass=stats.tokens_per_pass,
            # A finished answer shows the draft length it guessed at, not its last step's: an
            # answer's final steps are often plain (no room left to guess) though it drafted.
            draft_length=self._drafted_length if done is not None else self._draft_length,
            ttft_s=stats.ttft_s if started else None,
            sources=sources_line(stats.by_source),
            acceptance_history=tuple(self._history),
            finished=done is not None,
        )


def without_timings(stats: Stats) -> Stats:
    """A copy with the clock readings zeroed, for deterministic screens (snapshot tests)."""
    return replace(
        stats, ttft_s=0.0, decode_s=0.0, elapsed_s=0.0, prefill_s=0.0, draft_s=0.0, verify_s=0.0
    )


def figures_line(figures: Figures, mask_timings: bool = False, width: int | None = None) -> str:
    """'96 tok · 123.4 tok/s · accept 48% of 120 · 2.10 tok/pass · k 3 · ttft 0.05s'.

    Within `width` cells the parts that matter least go first (ttft, then k), so tok/s,
    acceptance and tokens per pass stay readable on a narrow terminal. 'plain' replaces
    'k 0': the policy is decoding without guesses because guessing does not pay here."""

    def timed(value: float | None, fmt: str) -> str:
        if value is None:
            return "–"
        return "··" if mask_timings else fmt.format(value)

    acceptance = figures.acceptance_rate
    per_pass = figures.tokens_per_pass
    proposed = f" of {figures.proposed}" if figures.proposed else ""
    draft_length = figures.draft_length
    parts = [
        f"{figures.tokens} tok",
        f"{timed(figures.decode_tokens_per_s, '{:.1f}')} tok/s",
        f"accept {'–' if acceptance is None else f'{acceptance:.0%}'}{proposed}",
        f"{'–' if per_pass is None else f'{per_pass:.2f}'} tok/pass",
        "plain" if draft_length == 0 else f"k {'–' if draft_length is None else draft_length}",
        f"ttft {timed(figures.ttft_s, '{:.2f}s')}",
    ]
    line = " · ".join(parts)
    for dropped in (5, 4):  # ttft, then k / plain
        if width is None or len(line) <= width:
            break
        del parts[dropped]
        line = " · ".join(parts)
    return line
