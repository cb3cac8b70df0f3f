"""A draft model's steps for every row of a batch at once.

Drafting row by row would cost rows x k small passes a cycle, which dominates the cycle once
the target's pass is shared. Here the draft model's caches hold every row (rows.py) and a
cycle drafts in max(k) batched steps: the first feeds each row the ids its draft has not seen
yet (ragged), the next ones one guess per row. A row's guesses are its own: greedy picks, or
its own draws (its seed and positions), so each row's drafts are what its drafter alone would
propose. After the verdict a row's draft cache is cut back to the ids that stayed.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn

from macspec.engine.caches.cached import SavedCache
from macspec.engine.caches.rows import RowsKVCache, rows_caches
from macspec.engine.core.sampling import probabilities
from macspec.engine.drafters.model import ModelDrafter, device_draft
from macspec.engine.drafters.protocol import Draft


class BatchDraftModel:
    """One draft model's caches for every row, drafting for all of them in batched steps."""

    def __init__(self, model: nn.Module, vocab_size: int | None, caches: list[RowsKVCache]):
        self.model = model
        self.vocab_size = vocab_size
        self.caches = caches
        self.fed: list[int] = []
        """Ids each row's draft cache holds."""

    @classmethod
    def able(cls, drafter: Any) -> BatchDraftModel | None:
        """A batched drafter for rows that would each get a drafter like `drafter`; None
        where it is not a plain draft model with attention caches only."""
        if type(drafter) is not ModelDrafter:
            return None
        caches = rows_caches(drafter.state.cache)
        if caches is None or not all(isinstance(c, RowsKVCache) for c in caches):
            return None
        return cls(drafter.state.model, drafter.vocab_size, caches)

    def add_row(self, drafter: ModelDrafter) -> None:
        """A row that joined: its draft cache (prefilled alone) moves into the batch."""
        for rows_cache, layer_cache in zip(self.caches, drafter.state.cache):
            rows_cache.add_row(layer_cache)
        self.fed.append(len(drafter.state))

    def keep_rows(self, kept: list[int]) -> None:
        for rows_cache in self.caches:
            rows_cache.keep_rows(kept)
        self.fed = [self.fed[i] for i in kept]

    def rollback(self, row: int, keep: int) -> None:
        self.fed[row] = min(self.fed[row], keep)

    def saved(self, row: int, context: list[int]) -> SavedCache:
        """Row `row`'s draft cache as a one-sequence saved state."""
        fed = self.fed[row]
        return SavedCache(tuple(context[:fed]), [c.row_cache(row, fed) for c in self.caches], {})

    def for_rows(self, rows: list, ks: list[int]) -> list[Draft] | None:
        """Every row's draft (rows: the batch's `Row`s) from batched steps; None: nobody
        guesses, or the draft model failed (then the rows that would have guessed go plain)."""
        if not any(ks):
            return None
        params = [row.answer.config.sampling for row in rows]
        draws = [
            row.answer.rng.draws(k, len(row.context)) if row.answer.rng is not None and k else None
            for row, k in zip(rows, ks)
        ]
        floors = [row.policy.confidence_floor for row in rows]
        contexts = [row.context for row in rows]
        try:
            return self.propose(contexts, ks, params, draws, floors)
        except Exception as exc:  # a guesser failed: these rows go plain
            for row, k in zip(rows, ks):
                if k:
                    row.guard.fail("propose", exc)
            return None

    def propose(
        self, contexts: list[list[int]], ks: list[int], params, draws, floors
    ) -> list[Draft]:
        """Each row's draft of ks[i] guesses after contexts[i] (rows with 0 get none, but
        their draft cache catches up): max(ks) batched steps of the draft model."""
        steps = max(ks)
        feeds = [context[fed:] for context, fed in zip(contexts, self.fed)]
        guesses: list[list[tuple[mx.array, mx.array]]] = [[] for _ in ks]
        ids = mx.zeros((len(feeds), max(len(f) for f in feeds)), mx.uint32)
        for i, feed in enumerate(feeds):
            ids[i, : len(feed)] = mx.array(feed, mx.uint32)
        ends = mx.array([len(f) - 1 for f in feeds])
        for step in range(steps):
            for rows_cache in self.caches:
                rows_cache.set_lengths(self.fed)
            logits = self.model(ids, cache=self.caches)
            last = logits[mx.arange(len(feeds)), ends][:, : self.vocab_size]
            picks = []
            for i, row in enumerate(last):
                row = row[None]
                if step >= ks[i] or params[i].greedy:
                    token, kept = mx.argmax(row, axis=-1), row  # greedy, or not kept anyway
                else:
                    kept = probabilities(row, params[i])
                    token = draws[i](kept, step)
                picks.append(token)
                if step < ks[i]:
                    guesses[i].append((token, kept))
            # Step 0 fed each row its own ids; later steps one guess a row.
            self.fed = [len(c) for c in contexts] if step == 0 else [f + 1 for f in self.fed]
            ids, ends = (
                mx.concatenate(picks)[:, None].astype(mx.uint32),
                mx.zeros((len(feeds),), mx.int32),
            )
            if step + 1 < steps:
                mx.async_eval(ids)
        # Each row keeps its draft cache up to its last guess but one (the target scores the
        # last); what rows that guessed less were fed beyond that is not theirs.
        self.fed = [len(c) + max(k - 1, 0) for c, k in zip(contexts, ks)]
        return [
            device_draft(rows, param, floor, k, len(feed) + max(k - 1, 0), "model")
            for rows, param, floor, k, feed in zip(guesses, params, floors, ks, feeds)
        ]
