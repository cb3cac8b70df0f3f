"""One request in a batch (engine/batch/engine.py): its state, and its verdict on a batched pass."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx

from macspec.engine.caches.cached import CachedModel, SavedCache
from macspec.engine.core.events import Cycle, Done, Event
from macspec.engine.core.grammar import Constraint
from macspec.engine.core.sampling import probabilities
from macspec.engine.core.verify import counted_guesses, greedy_verdict, sampled_verdict
from macspec.engine.drafters.guard import DrafterGuard
from macspec.engine.drafters.protocol import Draft, Drafter
from macspec.engine.generate.answer import AnswerState
from macspec.engine.policy.length import DraftPolicy


@dataclass
class Row:
    """One request in the batch."""

    prompt: list[int]
    answer: AnswerState
    drafter: Drafter | None
    policy: DraftPolicy | None
    alone: CachedModel | None
    """The target's cache while the prompt is prefilled alone (None once in the batch)."""
    to_prefill: list[int] = field(default_factory=list)
    context: list[int] = field(default_factory=list)
    """The prompt and every delivered id."""
    fed: int = 0
    """Ids of `context` the batch cache holds for this row."""
    events: list[Event] = field(default_factory=list)
    """Events not yet taken by the caller."""
    done: Done | None = None
    checkpoints: dict = field(default_factory=dict)
    """The prompt's checkpoint from its prefill (where a later turn can return to)."""
    held: list[int] = field(default_factory=list)
    """The ids the row's caches hold when it leaves the batch."""
    saved: list[SavedCache] | None = None
    """A finished row's caches (target, then draft model), for a prompt cache to keep."""
    constraint: Constraint | None = None
    """The matcher of the row's grammar, if it has one."""
    guard: DrafterGuard = field(default_factory=lambda: DrafterGuard("no"))
    """Every call into the row's drafter goes through it: a failing drafter is switched off."""

    @property
    def decoding(self) -> bool:
        return self.alone is None and self.done is None


def room(row: Row) -> int:
    """Most guesses a row may take: the target adds one token of its own."""
    return max(0, row.answer.config.max_tokens - len(row.answer.tokens) - 1)


def plan_row(
    row: Row, k: int, draft: Draft | None, forced: list[int], eos_ids: frozenset[int]
) -> tuple[list[int], Any, Draft | None, int]:
    """(ids to feed again, guesses, the draft, the draft length asked for) of one row's cycle:
    the batch draft model's draft, else the row's drafter's; a grammar's forced ids instead,
    free. A row under a grammar keeps the guesses it admits, on the host (for its masks)."""
    pending = row.context[row.fed :]
    if forced:
        draft, k = Draft(tokens=forced, source="grammar"), 0
    elif k <= 0:
        return pending, [], None, k
    elif draft is None:
        params, rng = row.answer.config.sampling, row.answer.rng
        draws = rng.draws(k, len(row.context)) if rng is not None else None
        floor = row.policy.confidence_floor
        draft = row.guard.call("propose", row.drafter.propose, row.context, k, params, draws, floor)
        if draft is None:  # the drafter failed: it is off, this row's cycle is a plain step
            return pending, [], None, 0
    guesses = draft.tokens
    if row.constraint is not None:
        guesses = guesses.tolist() if isinstance(guesses, mx.array) else list(guesses)
        guesses = row.constraint.admitted(guesses, eos_ids)
    elif not isinstance(guesses, mx.array):
        guesses = mx.array(list(guesses), mx.uint32)
    return pending, guesses, draft, k


def row_verdict(row: Row, plan, logits: mx.array, vocab_size: int | None) -> mx.array:
    """[cut, accepted, token, guesses...] for one row, on the device."""
    pending, guesses, draft, _ = plan
    params, rng = row.answer.config.sampling, row.answer.rng
    logits = logits[len(pending) - 1 :, :vocab_size]
    if row.constraint is not None:  # the grammar's p' = normalize(p * mask), at every position
        mask = mx.array(row.constraint.masks_along(list(guesses), logits.shape[-1]))
        logits = mx.where(mask, logits, mx.array(-float("inf"), logits.dtype))
    if not isinstance(guesses, mx.array):
        guesses = mx.array(guesses, mx.uint32)
    floor = row.policy.confidence_floor if row.policy is not None else None
    confidence = draft.confidence if draft is not None else None
    cut = counted_guesses(guesses, confidence, floor)
    position = len(row.context)
    if params.greedy:
        accepted, token = greedy_verdict(logits, guesses, cut)
    elif rng.noise is not None:  # coupled: the row's own seeded picks, kept while equal
        scores = mx.log(probabilities(logits, params))
        scores = scores + rng.noise.rows(position, scores.shape[0], scores.shape[-1])
        accepted, token = greedy_verdict(scores, guesses, cut)
    elif guesses.size == 0:  # a plain step samples as the single loop's plain step does
        accepted, token = mx.array(0), rng.pick(probabilities(logits, params), position)[0]
    else:
        p = probabilities(logits, params)
        accepted, token = sampled_verdict(p, draft.q, guesses, cut, rng.keys.next())
    head = mx.stack([x.astype(mx.int32) for x in (cut, accepted, token)])
    return mx.concatenate([head, guesses.astype(mx.int32)])


class RowView:
    """What `AnswerState.done` reads of an engine, for one row."""

    def __init__(self, row: Row):
        self.policy = row.policy
        self.drafter = row.drafter
        self.guard = row.guard


def settle_chain(engine, row: Row, plan, values: list[int], rows: int,
                 times: tuple[float, float, float]) -> int | None:  # fmt: skip
    """Keep what the verdict kept; where the row's recurrent state holds ids that were not
    kept, the count that were (the caller rewinds or restores the state), else None."""
    begun, drafted, verified = times
    pending, guesses, draft, requested = plan
    cut, n, token = values[0], values[1], values[2]
    counted = values[3 : 3 + cut]
    ends = next((i + 1 for i, t in enumerate(counted) if t in engine.eos_ids), cut)
    if ends < cut:
        cut, n, counted = ends, min(n, ends), counted[:ends]
    kept = counted[:n] + [token]
    if row.constraint is not None:
        row.constraint.keep(kept)
    valid = len(pending) + n  # the verified ids that stay; the rest is never seen again
    returned = engine.recurrent and valid < len(pending) + len(guesses)
    if not returned or engine.rewinds:  # rewound to the kept ids, or restored (`step`)
        row.fed += valid  # before `deliver`: a row that finishes holds what it was fed
    row.context += kept
    engine.draft_rollback(row, len(row.context) - 1)
    cycle = Cycle(
        requested=requested,
        proposed=cut,
        accepted=n,
        draft_s=(drafted - begun) / rows,
        verify_s=verified - drafted,
        overhead_s=0.0,
        draft_steps=draft.steps if draft is not None else 0,
        draft_fed=draft.fed if draft is not None else 0,
        draft_source=draft.source if draft is not None and cut else None,
        fed=len(pending) + len(guesses),
        refed=len(pending) - 1,
        timed=True,
        rows=rows,
    )
    forced = draft is not None and draft.source == "grammar"
    engine.deliver(row, cycle, kept, learn=not forced)  # forced ids say nothing of the drafter
    return valid if returned else None
