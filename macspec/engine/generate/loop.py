"""The guess-and-verify loop, as a generator of events.

Two layers, as in mlx-lm: `Engine.cycles` drafts, verifies, accepts and rolls back, yielding
token ids and cycle records; `Engine.generate` (answer.py) turns those into text, stops and
stats.
Plain decoding is the same loop with nothing drafted, so both share every stop rule.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from macspec.engine.caches.cached import DEFAULT_CACHE, CachedModel, CacheOptions
from macspec.engine.core.config import GenerationConfig
from macspec.engine.core.events import Cycle, Event, Prefill, Source
from macspec.engine.core.sampling import Randomness, SamplingParams, probabilities
from macspec.engine.core.stats import Stats
from macspec.engine.core.verify import counted_guesses, greedy_verdict, sampled_verdict
from macspec.engine.drafters.guard import DrafterGuard
from macspec.engine.drafters.protocol import Draft, Drafter
from macspec.engine.generate import answer
from macspec.engine.generate.constrained import constrained_cycles
from macspec.engine.generate.plain import CLEAR_CACHE_EVERY, Progress, plain_stretch
from macspec.engine.policy.length import AutoPolicy, DraftPolicy
from macspec.engine.trees.cycle import propose_tree, verify_tree
from macspec.engine.trees.shapes import TreeDraft

PROBE_EVERY = 32
"""Every this many speculative cycles (and the first two), one waits after drafting too, so
drafting and verifying are timed apart for the policy; the others wait once. The policy learns
the target's passes from every cycle's whole time too, so probes are needed only to keep the
price of a guess fresh: each one idles an Apple GPU while the host reads the draft."""
FIRST_PROBES = 2
"""The first speculative cycles of an engine are all probes: a guess has no price before."""
MAX_REFEED = 8
"""Most ids a verify pass feeds again after checkpoint restores before a plain step catches up."""

DEFAULT_GENERATION = GenerationConfig()
"""Greedy, 256 tokens, no stops: what `generate` does when told nothing."""

__all__ = ["Engine", "GenerationConfig"]  # GenerationConfig lives in engine/core/config.py


@dataclass
class _Ahead:
    """A cycle drafted before the consumer took the previous cycle's tokens."""

    k: int
    requested: int
    draft: Draft | TreeDraft
    drafting_s: float


class Engine:
    """A target model, an optional drafter, and their caches, reused across generations."""

    def __init__(
        self,
        target: nn.Module,
        tokenizer,
        drafter: Drafter | None = None,
        policy: DraftPolicy | None = None,
        vocab_size: int | None = None,
        cache_options: CacheOptions = DEFAULT_CACHE,
    ):
        self.target = CachedModel(target, name="target model", options=cache_options)
        self.guard = DrafterGuard(drafter.name if drafter is not None else "no")
        """Every call into the drafter goes through it: a failing drafter is switched off."""
        if drafter is not None:
            self.target.require_rollback()
            if drafter.needs is not None:  # the drafter reads the target's hidden states
                self.target.tap(drafter.needs, self._add_hidden)
        self.tokenizer = tokenizer
        self.eos_ids = frozenset(tokenizer.eos_token_ids)
        self._cycles_run = 0
        self.drafter = drafter
        self.policy = policy if policy is not None or drafter is None else AutoPolicy()
        self.vocab_size = vocab_size
        """Ids both models score (the draft's embedding table may be padded differently)."""
        if self.policy is not None:
            self.policy.bind(self)

    def drafting(self) -> bool:
        """Whether this request drafts: a drafter, not switched off by a failure."""
        return self.drafter is not None and self.guard.on

    def _add_hidden(self, start: int, hidden) -> None:
        self.guard.call("add_hidden", self.drafter.add_hidden, start, hidden)

    def cached_models(self) -> list[CachedModel]:
        """Every model cache the engine keeps: the target's, and the drafter's if any."""
        return [self.target, *(self.drafter.caches() if self.drafter is not None else [])]

    # -- the raw loop --------------------------------------------------------------------
    def cycles(
        self, prompt: list[int], config: GenerationConfig, rng: Randomness | None, stats: Stats
    ) -> Iterator[Prefill | Cycle | tuple[int, Source]]:
        target, drafter, params = self.target, self.drafter, config.sampling
        started = time.perf_counter()
        pending = target.reuse(prompt)
        stats.prefilled_tokens = len(pending)
        yield Prefill(len(prompt), len(prompt) - len(pending))
        target.prefill(pending[:-1], config.prefill_step_size)
        # Where the next chat turn can return to if its prompt differs after this one (a model
        # with recurrent layers cannot trim back to it); free for attention-only models.
        target.checkpoint("prompt")
        self.guard.reset()
        if drafter is not None:
            self.guard.call("start", drafter.start, prompt)
            self.policy.begin(config.sampling)  # a policy may keep its figures per temperature
        stats.prefill_s = time.perf_counter() - started

        context = list(prompt)
        progress = Progress()
        ahead: _Ahead | None = None
        try:
            if config.grammar is not None:  # masks from the host's matcher: a loop of its own
                for item in constrained_cycles(self, context, config, rng):
                    progress.delivered += isinstance(item, tuple)
                    yield item
                return
            while progress.delivered < config.max_tokens:
                begun = time.perf_counter()
                if ahead is not None:  # drafted while the consumer took the last cycle's tokens
                    k, requested, draft = ahead.k, ahead.requested, ahead.draft
                    begun -= ahead.drafting_s
                    ahead = None
                else:
                    if not self.drafting():
                        requested = 0
                    elif progress.decided is not None:
                        requested, progress.decided = progress.decided, None
                    else:
                        requested = self.policy.draft_length()
                    # The target adds one token of its own: never guess past max_tokens.
                    k = min(requested, config.max_tokens - progress.delivered - 1)
                    if k <= 0:
                        yield from plain_stretch(self, context, config, rng, progress, requested)
                        continue
                    if self._refeed_due(context):
                        # Restores in a row (recurrent layers without an exact rewind) have piled
                        # up ids to feed again: catch up with a plain step, which yields a token
                        # of its own, rather than widen every pass. Then draft as asked.
                        yield from plain_stretch(
                            self, context, config, rng, progress, requested, once=True
                        )
                        progress.decided = requested
                        continue
                    draft = None

                # Draft, verify all guesses in one target pass, accept, roll back.
                speculated = self._speculate(context, k, requested, params, rng, begun, draft)
                if speculated is None:  # the drafter failed: it is off, the loop goes plain
                    continue
                cycle, kept = speculated
                self.policy.observe(cycle)
                ahead = self._draft_ahead(context, config, rng, progress, kept)
                # The record comes first: a consumer that stops mid-cycle has still counted it.
                yield cycle
                for i, token in enumerate(kept):
                    progress.delivered += 1
                    yield token, (Source.DRAFT if i < len(kept) - 1 else Source.TARGET)
                    if progress.delivered % CLEAR_CACHE_EVERY == 0:
                        mx.clear_cache()
        finally:
            # Closed early (EOS, stop string, cancel, Ctrl-C): drop what was not delivered.
            keep = len(prompt) + progress.delivered - 1
            target.settle(keep, context[keep] if progress.delivered else None)
            if drafter is not None:
                self.guard.call("rollback", drafter.rollback, keep)

    def _probe_due(self) -> bool:
        """Whether the next speculative cycle times drafting and verifying apart; only a
        policy that prices one against the other needs it."""
        cycle = self._cycles_run + 1
        return self.policy.wants_timings and (cycle <= FIRST_PROBES or cycle % PROBE_EVERY == 0)

    def _refeed_due(self, context: list[int]) -> bool:
        """Whether restores in a row have piled up more ids to feed again than a verify pass
        should carry (recurrent layers without an exact rewind)."""
        return len(context) - len(self.target) > MAX_REFEED

    def _draft_ahead(
        self,
        context: list[int],
        config: GenerationConfig,
        rng: Randomness | None,
        progress: Progress,
        kept: list[int],
    ) -> _Ahead | None:
        """Queue the next cycle's draft before the consumer takes this cycle's tokens, so the
        device drafts while the host turns tokens into text (a stall's worth per cycle on a
        GPU). Not past the answer's end, and not before a probe cycle, which times drafting."""
        delivered = progress.delivered + len(kept)
        ending = delivered >= config.max_tokens or not self.eos_ids.isdisjoint(kept)
        if ending or self._probe_due() or not self.drafting():
            return None
        requested = self.policy.draft_length()
        k = min(requested, config.max_tokens - delivered - 1)
        if k <= 0 or self._refeed_due(context):
            # A plain step comes first: the loop takes it, with the length decided here.
            progress.decided = requested
            return None
        begun = time.perf_counter()
        draft = self._propose(context, k, config.sampling, rng)
        if draft is None:  # the drafter failed: the next cycle is plain
            return None
        return _Ahead(k, requested, draft, time.perf_counter() - begun)

    def _propose(
        self, context: list[int], k: int, params: SamplingParams, rng: Randomness | None
    ) -> Draft | TreeDraft | None:
        """The drafter's guesses, or None: it failed and is off for the request."""
        return self.guard.call("propose", self._guesses, context, k, params, rng)

    def _guesses(
        self, context: list[int], k: int, params: SamplingParams, rng: Randomness | None
    ) -> Draft | TreeDraft:
        """The drafter's guesses, queued on the device: its last step then runs while the host
        builds the verify pass (rather than after, when the verdict is read). A tree when the
        policy plans one (`--draft-tree`)."""
        tree = propose_tree(self, context, k, params, rng)
        if tree is not None:
            return tree
        draws = rng.draws(k, len(context)) if rng is not None else None
        draft = self.drafter.propose(context, k, params, draws, self.policy.confidence_floor)
        if isinstance(draft.tokens, mx.array):
            mx.async_eval(draft.tokens)
        return draft

    def _speculate(
        self,
        context: list[int],
        k: int,
        requested: int,
        params: SamplingParams,
        rng: Randomness | None,
        begun: float,
        draft: Draft | TreeDraft | None = None,
    ) -> tuple[Cycle, list[int]] | None:
        """One cycle: draft (unless drafted ahead), verify in one target pass, accept, roll
        back. The guesses stay on the device into the verify pass, and the verdict is read with
        them: one wait. A probe cycle now and then waits after drafting too, to time drafting
        and verifying apart. None: the drafter failed, nothing was done."""
        target = self.target
        timed = draft is None and self._probe_due()
        if draft is None:
            draft = self._propose(context, k, params, rng)
            if draft is None:
                return None
        self._cycles_run += 1
        if isinstance(draft, TreeDraft):
            return verify_tree(self, context, draft, requested, params, rng, begun, timed)
        guesses = draft.tokens
        if not isinstance(guesses, mx.array):
            guesses = mx.array(list(guesses), mx.uint32)
        if timed:
            mx.eval(guesses)
        drafted = time.perf_counter()
        pending = context[len(target) :]  # after a restored checkpoint: ids to feed again
        target.checkpoint()
        ids = mx.concatenate([mx.array(pending, mx.uint32), guesses.astype(mx.uint32)])
        logits = target.forward(ids)[-(guesses.size + 1) :, : self.vocab_size]
        cut = counted_guesses(guesses, draft.confidence, self.policy.confidence_floor)
        if params.greedy:
            accepted, token = greedy_verdict(logits, guesses, cut)
        elif rng.noise is not None:  # coupled: the target's own seeded picks, kept while equal
            scores = mx.log(probabilities(logits, params))
            scores = scores + rng.noise.rows(len(context), scores.shape[0], scores.shape[-1])
            accepted, token = greedy_verdict(scores, guesses, cut)
        else:
            p = probabilities(logits, params)
            accepted, token = sampled_verdict(p, draft.q, guesses, cut, rng.keys.next())
        # The cycle's one wait: how many guesses count, the verdict, and the guesses.
        head = mx.stack([x.astype(mx.int32) for x in (cut, accepted, token)])
        read = mx.concatenate([head, guesses.astype(mx.int32)]).tolist()
        verified = time.perf_counter()
        cut, n, token, counted = read[0], read[1], read[2], read[3 : 3 + read[0]]
        return self._settle(context, draft, cut, n, token, counted, requested, pending,
                            guesses.size, timed, begun, drafted, verified)  # fmt: skip

    def _settle(
        self, context: list[int], draft, cut: int, n: int, token: int, counted: list[int],
        requested: int, pending: list[int], proposed_ids: int, timed: bool, begun: float,
        drafted: float, verified: float,
    ) -> tuple[Cycle, list[int]]:  # fmt: skip
        """After the cycle's one read: cut at an end of sequence, keep the kept guesses, roll
        both models back, and record the cycle."""
        target = self.target
        # Guesses count through the first end of sequence: cut here, on the host, from the
        # guesses just read (no device work). A kept EOS ends the answer, so the verdict's
        # token after it is never used.
        ends = next((i + 1 for i, t in enumerate(counted) if t in self.eos_ids), cut)
        if ends < cut:
            cut, n, counted = ends, min(n, ends), counted[:ends]
        draft.tokens = counted  # what the drafter proposed that counted, now known
        # Keep the kept guesses (the new token is fed next cycle); a recurrent model returns
        # to the checkpoint instead and feeds the kept ones again then.
        target.trim_to(len(context) + n)
        kept = counted[:n] + [token]
        context += kept
        self.guard.call("rollback", self.drafter.rollback, len(context) - 1)
        cycle = Cycle(
            requested=requested,
            proposed=cut,
            accepted=n,
            draft_s=drafted - begun if timed else 0.0,
            verify_s=verified - (drafted if timed else begun),
            overhead_s=time.perf_counter() - verified,
            draft_steps=draft.steps,
            draft_fed=draft.fed,
            draft_source=draft.source if cut else None,
            fed=len(pending) + proposed_ids,
            refed=len(pending) - 1,
            timed=timed,
        )
        return cycle, kept

    # -- events ----------------------------------------------------------------------------
    def generate(
        self,
        prompt: Sequence[int],
        config: GenerationConfig = DEFAULT_GENERATION,
        cancelled: Callable[[], bool] | None = None,
    ) -> Iterator[Event]:
        """Yield Token and Cycle events, then one Done (engine/generate/answer.py turns the raw
        loop's ids into text, stops and stats).

        The prompt must leave room in `config.context_length`; the answer ends at it.

        `cancelled` is polled after every token; when it returns True the generation ends
        with finish_reason 'cancelled' (closing the generator works too, without a Done).
        """
        return answer.generate(self, prompt, config, cancelled)
