"""What the engine drafts through. A drafter proposes up to k next tokens for the target to
verify; it never verifies.

The engine owns the committed sequence (`context`); a drafter only has to guess its next
tokens and, after each cycle, `rollback` to the part of it that survived verification.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import mlx.core as mx

from macspec.engine.caches.cached import CachedModel
from macspec.engine.core.sampling import Draws, SamplingParams
from macspec.engine.core.taps import Hidden, HiddenSpec


@dataclass
class Draft:
    """One cycle's guesses."""

    tokens: list[int] | mx.array
    """The guessed ids, in order (possibly fewer than asked for): a list, or a (k,) array still
    on the device, which the engine reads with the verdict, in the cycle's one wait. After the
    cycle the engine sets it to the list of guesses that counted."""
    q: mx.array | None = None
    """(len(tokens), V) distributions the guesses were drawn from; None: deterministic guesses."""
    confidence: mx.array | None = None
    """(len(tokens),) the drafter's top probability at each guess, for the policy's confidence
    floor (applied on the device: guesses from the first one below it on do not count)."""
    steps: int = 0
    """Forward passes the drafter ran (its cost, for the draft-length policy)."""
    fed: int = 0
    """Ids the drafter's model processed, catch-up after plain target steps included."""
    source: str = "model"
    """Which kind of guess this is ('model', 'lookup'), for per-source acceptance."""


class Drafter(Protocol):
    """The interface the engine drafts through. Drafters subclass it to inherit its defaults:
    a drafter that reads nothing from the verify pass and keeps no model cache says nothing."""

    name: str
    """Shown in stats: 'model', 'lookup', ..."""
    needs: HiddenSpec | None = None
    """What the drafter reads from the target's verify pass (the final hidden state, named
    layers' outputs), or None: nothing. The target returns it from the same pass and hands it
    to `add_hidden`."""

    def start(self, prompt: Sequence[int]) -> None:
        """A new generation begins with this prompt; prefill whatever state is reusable."""

    def propose(
        self,
        context: Sequence[int],
        k: int,
        params: SamplingParams,
        draws: Draws | None,
        confidence_floor: float | None,
    ) -> Draft:
        """Guess up to k tokens after `context` (prompt + all committed tokens).

        With a `confidence_floor`, stop before a guess whose top probability falls below it.
        `draws` turns distributions into guesses when sampling (params.temperature > 0).
        """

    def rollback(self, keep: int) -> None:
        """Forget state beyond the first `keep` ids of the context (rejected guesses)."""

    def add_hidden(self, start: int, hidden: Hidden) -> None:
        """The target's hidden states (what `needs` asked for) of positions start, start + 1,
        ...; called only when `needs` is set."""
        raise NotImplementedError(f"the {self.name} drafter asked for no hidden states")

    def caches(self) -> list[CachedModel]:
        """The model caches this drafter keeps beside the target's (the engine saves, restores
        and reuses them with the target's); none for drafters without a model."""
        return []

    def active(self) -> Drafter:
        """The drafter that drafts the next cycle: itself, or the one `--draft auto` picked."""
        return self
