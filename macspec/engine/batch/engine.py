"""Several requests decoded together: one target pass per cycle for every row's guesses, each
row verified, accepted and rolled back on its own, so each answer is exactly what the same
request alone would be (greedy: token for token; seeded: the coupled sampler keys its noise by
seed and position, per row; unseeded: the rejection rule per row).

A request joins as a row once its prompt is prefilled alone, in chunks between the running
rows' cycles (`prefill_step`), as `run` would prefill it, then its caches are appended to the
batch (rows.py). Each cycle (`step`): every row's drafter guesses (its own drafter instance:
draft model, lookup, MTP head, DFlash...), one batched target pass verifies all of them, the
verdicts are read in one wait, and each row's answer layer (`AnswerState`) turns its ids into
events. A finished row leaves the batch at once. With `--draft-tree`, rows verify trees of
their own sizes in the same pass (tree.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import ExitStack
from functools import partial

import mlx.core as mx
import mlx.nn as nn

from macspec.engine.batch import tree as batchtree
from macspec.engine.batch.draft import BatchDraftModel
from macspec.engine.batch.pricing import BatchPricing
from macspec.engine.batch.row import Row, RowView, plan_row, room, row_verdict, settle_chain
from macspec.engine.batch.tree import TreePlan
from macspec.engine.caches import recurrent
from macspec.engine.caches.cached import DEFAULT_CACHE, CachedModel, CacheOptions, SavedCache
from macspec.engine.caches.rows import RowsArraysCache, RowsKVCache, rows_caches
from macspec.engine.core.config import GenerationConfig
from macspec.engine.core.events import Cycle, Prefill, Source
from macspec.engine.core.grammar import Constraint
from macspec.engine.core.taps import Hidden, Taps
from macspec.engine.drafters.guard import DrafterGuard
from macspec.engine.drafters.protocol import Drafter
from macspec.engine.generate.answer import AnswerState
from macspec.engine.policy.length import DraftPolicy
from macspec.engine.trees.sizing import TreePolicy

PREFILL_CHUNK = 512
"""Prompt ids a joining row prefills between two cycles of the running rows."""


class BatchEngine:
    """The target's batched passes over rows, each row with its own drafter and policy."""

    def __init__(
        self,
        target: nn.Module,
        tokenizer,
        new_drafter: Callable[[], Drafter] | None = None,
        new_policy: Callable[[Drafter], DraftPolicy] | None = None,
        vocab_size: int | None = None,
        cache_options: CacheOptions = DEFAULT_CACHE,
    ):
        self.model = target
        self.tokenizer = tokenizer
        self.eos_ids = frozenset(tokenizer.eos_token_ids)
        self.new_drafter = new_drafter
        self.new_policy = new_policy
        self.vocab_size = vocab_size
        self.cache_options = cache_options
        probe = CachedModel(target, options=cache_options)
        caches = rows_caches(probe.cache)
        if caches is None:
            kinds = sorted({type(c).__name__ for c in probe.cache})
            raise ValueError(f"its caches ({', '.join(kinds)}) cannot be batched")
        self.caches: list[RowsKVCache | RowsArraysCache] = caches
        self.recurrent = any(isinstance(c, RowsArraysCache) for c in caches)
        """Whether some layer keeps recurrent state (a rejected guess costs a re-feed)."""
        recorded = recurrent.install(target)
        self.rewinds = recorded > 0 and recorded == sum(
            isinstance(c, RowsArraysCache) for c in caches
        )
        """Whether every recurrent layer is Gated DeltaNet: a row that rejects is rewound to
        its kept ids from what the pass recorded (recurrent.py), with nothing fed again."""
        self.rows: list[Row] = []
        """Rows in the batch, in the batch's order (rows still prefilling are not in it)."""
        self.joining: list[Row] = []
        self.drafter = new_drafter() if new_drafter is not None else None
        """A drafter of the kind every row gets (for its name and what it reads)."""
        policy = new_policy(self.drafter) if self.drafter is not None and new_policy else None
        self.trees = isinstance(policy, TreePolicy)
        """Whether rows may verify draft trees (`--draft-tree`; each row drafts its own)."""
        self.tree_note: str | None = None
        """Why rows verify chains though trees were asked for (checked at the first row)."""
        self._tree_checked = False
        self.batch_draft = None if self.trees else BatchDraftModel.able(self.drafter)
        """Draft-model rows drafting in batched steps (None: each row drafts on its own)."""
        needs = self.drafter.needs if self.drafter is not None else None
        self.taps = Taps(target, needs) if needs is not None else None
        self.passes = 0
        """Batched target passes run (one per cycle, whatever the number of rows)."""
        self.pricing = BatchPricing()
        self._learned: DraftPolicy | None = None
        """The policy of the row that finished last: a new row starts from its figures."""

    # -- joining -------------------------------------------------------------------------------
    def admit(
        self,
        prompt: list[int],
        config: GenerationConfig,
        cancelled: Callable[[], bool] | None = None,
        start_from: SavedCache | None = None,
    ) -> Row:
        """A new request: its first events (Prefill) are ready; its prompt is prefilled by
        `prefill_step` calls, then it decodes with the others."""
        prompt = [int(t) for t in prompt]
        answer = AnswerState(self, prompt, config, cancelled)
        alone = CachedModel(self.model, name="target model", options=self.cache_options)
        if start_from is not None:
            alone.load(start_from)
        drafter = self.new_drafter() if self.new_drafter is not None else None
        policy = self.new_policy(drafter) if drafter is not None else None
        if policy is not None:
            if self._learned is not None:
                policy.carry_from(self._learned)
            policy.begin(config.sampling)  # --draft auto keeps its figures per temperature
        guard = DrafterGuard(drafter.name if drafter is not None else "no")
        if drafter is not None and drafter.needs is not None:
            alone.tap(drafter.needs, partial(guard.call, "add_hidden", drafter.add_hidden))
        pending = alone.reuse(prompt)
        answer.stats.prefilled_tokens = len(pending)
        row = Row(prompt, answer, drafter, policy, alone, to_prefill=pending[:-1], guard=guard)
        if config.grammar is not None:
            row.constraint = Constraint(config.grammar, self.tokenizer)
        if self.trees:
            if not self._tree_checked:  # a small tree pass against the sequential one, once
                self._tree_checked = True
                ids = (prompt * 3)[-3:]
                self.tree_note = batchtree.tree_note(self.model, self.caches, self.rewinds, ids)
            batchtree.bind(row, self.tree_note, self.recurrent)
        row.events.append(Prefill(len(prompt), len(prompt) - len(pending)))
        self.joining.append(row)
        return row

    def prefill_step(self, row: Row, chunk: int = PREFILL_CHUNK) -> bool:
        """Prefill the next chunk of a joining row; True once it has joined the batch."""
        started = time.perf_counter()
        ids, row.to_prefill = row.to_prefill[:chunk], row.to_prefill[chunk:]
        if ids:
            row.alone.prefill(ids, chunk)
        row.answer.stats.prefill_s += time.perf_counter() - started
        if row.to_prefill:
            return False
        row.alone.checkpoint("prompt")
        if row.drafter is not None:
            row.guard.call("start", row.drafter.start, row.prompt)
        for rows_cache, layer_cache in zip(self.caches, row.alone.cache):
            rows_cache.add_row(layer_cache)
        if self.batch_draft is not None:
            self.batch_draft.add_row(row.drafter)
        row.checkpoints = dict(row.alone._checkpoints)
        row.fed, row.context, row.alone = len(row.alone), list(row.prompt), None
        self.joining.remove(row)
        self.rows.append(row)
        return True

    # -- one cycle for every row ---------------------------------------------------------------
    def step(self) -> None:
        """One draft-verify-accept cycle for every decoding row; their events are in
        `row.events`, and finished rows leave the batch."""
        rows = [r for r in self.rows if r.decoding]
        if not rows:
            return
        begun = time.perf_counter()
        ks = [min(k, room(row)) for row, k in zip(rows, self.pricing.draft_lengths(rows))]
        # A grammar's forced ids are a row's guesses for free: it drafts nothing this cycle.
        forced = [r.constraint.forced()[: room(r)] if r.constraint else [] for r in rows]
        ks = [0 if ids else k for k, ids in zip(ks, forced)]
        drafts = self.batch_draft.for_rows(rows, ks) if self.batch_draft is not None else None
        plans = []
        for i, (row, k) in enumerate(zip(rows, ks)):
            tree = batchtree.plan_tree(row, k) if self.trees and not forced[i] else None
            draft = drafts[i] if drafts else None
            plans.append(tree or plan_row(row, k, draft, forced[i], self.eos_ids))
        drafted = time.perf_counter()
        widths = [batchtree.width_of(plan) for plan in plans]
        width = max(widths)
        inputs = mx.zeros((len(rows), width), mx.uint32)
        for i, plan in enumerate(plans):
            if isinstance(plan, TreePlan):
                ids = plan.ids()
            else:
                pending, guesses = plan[0], plan[1]
                ids = mx.array(pending, mx.uint32)
                if len(guesses):
                    ids = mx.concatenate([ids, mx.array(guesses).astype(mx.uint32)])
            inputs[i, : ids.size] = ids
        for rows_cache in self.caches:
            rows_cache.set_lengths([row.fed for row in rows])
        states = [c for c in self.caches if isinstance(c, RowsArraysCache)]
        before = [c.prepare_pass(widths, width) for c in states]
        with ExitStack() as stack:
            record, ancestry, branched = None, {}, None
            if self.rewinds:
                record = stack.enter_context(recurrent.recording(recurrent.PassRecord()))
            if any(isinstance(plan, TreePlan) for plan in plans):
                trees = batchtree.tree_pass(self.caches, plans, width, self.rewinds)
                ancestry, branched = stack.enter_context(trees)
            hidden = None
            if self.taps is not None:
                hidden = stack.enter_context(self.taps.record(batch=True))
            logits = self.model(inputs, cache=self.caches)
        if any(row.constraint is not None for row in rows):
            mx.async_eval(logits)  # the pass runs while the host fills the grammars' masks
        for c in states:
            c.end_pass()
        self.passes += 1
        reads = []
        for i, (row, plan) in enumerate(zip(rows, plans)):
            if isinstance(plan, TreePlan):
                read = batchtree.tree_row_verdict(
                    row, plan, ancestry[i], logits[i], self.vocab_size
                )
            else:
                read = row_verdict(row, plan, logits[i, : widths[i]], self.vocab_size)
            reads.append(read)
        # The cycle's one wait: every row's verdict and guesses.
        widest = max(r.size for r in reads)
        read = mx.stack([mx.pad(r, (0, widest - r.size)) for r in reads]).tolist()
        verified = time.perf_counter()
        self.pricing.observe(len(rows) * width, verified - drafted)
        times = (begun, drafted, verified)
        returned = []
        for i, (row, plan, values) in enumerate(zip(rows, plans, read)):
            if isinstance(plan, TreePlan):
                path = batchtree.settle_tree(self, row, i, plan, values, hidden, len(rows), times)
                returned.append(None)
                if branched is not None:  # the recurrent state after the row's kept path
                    batchtree.keep_states(self.caches, branched, i, path)
                continue
            if hidden is not None:
                part = Hidden(
                    final=None if hidden.final is None else hidden.final[i, : widths[i]],
                    layers={k: v[i, : widths[i]] for k, v in hidden.layers.items()},
                )
                row.guard.call("add_hidden", row.drafter.add_hidden, row.fed, part)
            valid = settle_chain(self, row, plan, values, len(rows), times)
            if branched is not None:  # a chain in a pass over trees: its kept rows' state
                batchtree.keep_states(self.caches, branched, i, range(valid or widths[i]))
                returned.append(None)
                continue
            returned.append(valid if valid is not None and not self.rewinds else None)
            if valid is not None and self.rewinds:  # recomputed at the kept ids, exactly
                for j, c in enumerate(states):
                    conv, state = recurrent.states_after(record, j, valid, row=i)
                    c.cache[0][i : i + 1], c.cache[1][i : i + 1] = conv, state
        # Otherwise a row that kept fewer ids than it fed returns its recurrent state to before
        # the pass (attention is simply shorter), and feeds the kept ids again next cycle.
        for c, state in zip(states, before):
            c.restore_rows(state, [r is not None for r in returned])
        for rows_cache in self.caches:
            rows_cache.set_lengths([row.fed for row in rows])
        self._leave()

    def deliver(self, row: Row, cycle: Cycle, kept: list[int], learn: bool = True) -> None:
        """A settled cycle: the policy learns from it (`learn`), the answer takes its record
        and its ids (events), and a finished row is finished."""
        if row.policy is not None and learn:
            row.policy.observe(cycle)
        answer = row.answer
        answer.cycle(cycle)
        row.events.append(cycle)
        for i, token_id in enumerate(kept):
            event = answer.token(token_id, Source.DRAFT if i < len(kept) - 1 else Source.TARGET)
            if event is not None:
                row.events.append(event)
            if answer.check_cancelled():
                break
        if answer.finish is not None:
            self._finish(row)

    def _finish(self, row: Row) -> None:
        """The row's Done, and its caches kept as far as ids were delivered."""
        answer = row.answer
        delivered = len(answer.tokens) + answer.stats.end_tokens
        full, row.context = row.context, row.context[: len(row.prompt) + delivered]
        if not self.recurrent:  # attention keeps only what was delivered
            row.fed = min(row.fed, len(row.context) - 1)
        row.held = full[: row.fed]  # a recurrent state holds what it was fed, delivered or not
        self.draft_rollback(row, min(row.fed, len(row.context) - 1))
        row.done = answer.done(RowView(row))
        if row.policy is not None:
            self._learned = row.policy
        stats = row.done.stats
        priced_plain = self.pricing.plain and row.guard.on  # not: the drafter failed
        if stats.plain_reason and (stats.rows_per_pass or 1) > 1 and priced_plain:
            stats.plain_reason = (
                f"plain: guessing does not pay here at {stats.rows_per_pass:.1f} requests per pass"
            )
        row.events.append(row.done)

    def draft_rollback(self, row: Row, keep: int) -> None:
        if self.batch_draft is not None and row in self.rows:
            row.guard.call("rollback", self.batch_draft.rollback, self.rows.index(row), keep)
        elif row.drafter is not None:
            row.guard.call("rollback", row.drafter.rollback, keep)

    def cancel(self, row: Row) -> None:
        """End a row now (its client went away): it leaves the batch at once."""
        if row.done is not None:
            return
        if row in self.joining:
            self.joining.remove(row)
            row.answer.finish = "cancelled"
            row.done = row.answer.done(RowView(row))
            row.events.append(row.done)
            return
        row.answer.finish = row.answer.finish or "cancelled"
        self._finish(row)
        self._leave()

    def drop_rows(self) -> None:
        """Drop every row of the batch (after a pass failed: their caches cannot be trusted);
        rows still prefilling are kept."""
        self.rows = []
        for rows_cache in self.caches:
            rows_cache.keep_rows([])
        if self.batch_draft is not None:
            self.batch_draft.keep_rows([])

    def _leave(self) -> None:
        """Finished rows leave the batch, their caches saved as one-sequence states."""
        kept = []
        for index, row in enumerate(self.rows):
            if row.done is None:
                kept.append(index)
                continue
            cache = [rows_cache.row_cache(index, row.fed) for rows_cache in self.caches]
            saved = [SavedCache(tuple(row.held), cache, row.checkpoints)]
            if self.batch_draft is not None:
                saved.append(self.batch_draft.saved(index, row.context))
            else:
                caches = row.drafter.caches() if row.drafter is not None else []
                saved += [state.save() for state in caches]
            row.saved = saved
        if len(kept) == len(self.rows):
            return
        for rows_cache in self.caches:
            rows_cache.keep_rows(kept)
        if self.batch_draft is not None:
            self.batch_draft.keep_rows(kept)
        self.rows = [self.rows[i] for i in kept]
