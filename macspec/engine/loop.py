"""The guess-and-verify loop, as a generator of events.

Two layers, as in mlx-lm: `_cycles` drafts, verifies, accepts and rolls back, yielding
token ids and cycle records; `Engine.generate` turns those into text, stops and stats.
Plain decoding is the same loop with nothing drafted, so both share every stop rule.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

import mlx.core as mx
import mlx.nn as nn

from macspec.engine.cached import CachedModel
from macspec.engine.drafters import Draft, Drafter
from macspec.engine.events import Cycle, Done, Event, Source, Token
from macspec.engine.policy import AutoPolicy, DraftPolicy
from macspec.engine.sampling import KeyStream, SamplingParams, probabilities, sample
from macspec.engine.stats import Stats
from macspec.engine.stops import StopScanner
from macspec.engine.verify import Verdict, verify_greedy, verify_sampled
from macspec.errors import MacspecError

MAX_REFEED = 8
"""Most ids a verify pass feeds again after checkpoint restores before a plain step catches up."""


@dataclass(frozen=True)
class GenerationConfig:
    """What to generate and when to stop."""

    max_tokens: int = 256
    """Most tokens to generate."""
    sampling: SamplingParams = SamplingParams()
    """Temperature and filters; the default is greedy."""
    stop_strings: tuple[str, ...] = ()
    """Text that ends the answer when it appears (it is not shown)."""
    seed: int | None = None
    """Seed for sampled runs; None draws a fresh one."""
    context_length: int | None = None
    """Tokens the model can attend to, prompt included; the answer stops there (finish
    reason 'context') and a prompt that fills it is refused. None: no limit."""

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise MacspecError(f"--max-tokens must be >= 1, got {self.max_tokens}")


@dataclass
class _Progress:
    """Where a generation stands, shared by the loop and its plain stretches."""

    delivered: int = 0
    """Ids handed to the consumer; on exit the caches keep only those."""
    decided: int | None = None
    """A draft length the policy chose ahead, during a plain stretch."""


class Engine:
    """A target model, an optional drafter, and their caches, reused across generations."""

    def __init__(
        self,
        target: nn.Module,
        tokenizer,
        drafter: Drafter | None = None,
        policy: DraftPolicy | None = None,
        vocab_size: int | None = None,
    ):
        self.target = CachedModel(target, name="target model")
        if drafter is not None:
            self.target.require_rollback()
        self.tokenizer = tokenizer
        self.eos_ids = frozenset(tokenizer.eos_token_ids)
        self.drafter = drafter
        self.policy = policy if policy is not None or drafter is None else AutoPolicy()
        self.vocab_size = vocab_size
        """Ids both models score (the draft's embedding table may be padded differently)."""

    # -- the raw loop --------------------------------------------------------------------
    def _cycles(
        self, prompt: list[int], config: GenerationConfig, keys: KeyStream | None, stats: Stats
    ) -> Iterator[Cycle | tuple[int, Source]]:
        target, drafter, params = self.target, self.drafter, config.sampling
        started = time.perf_counter()
        pending = target.reuse(prompt)
        stats.prefilled_tokens = len(pending)
        target.prefill(pending[:-1])
        # Where the next chat turn can return to if its prompt differs after this one (a model
        # with recurrent layers cannot trim back to it); free for attention-only models.
        target.checkpoint("prompt")
        if drafter is not None:
            drafter.start(prompt)
        stats.prefill_s = time.perf_counter() - started

        context = list(prompt)
        progress = _Progress()
        try:
            while progress.delivered < config.max_tokens:
                begun = time.perf_counter()
                if drafter is None:
                    requested = 0
                elif progress.decided is not None:
                    requested, progress.decided = progress.decided, None
                else:
                    requested = self.policy.draft_length()
                # The target adds one token of its own: never guess past max_tokens.
                k = min(requested, config.max_tokens - progress.delivered - 1)
                if k <= 0:
                    yield from self._plain_stretch(context, config, keys, progress, requested)
                    continue
                if len(context) - len(target) > MAX_REFEED:
                    # Restores in a row (recurrent layers without an exact rewind) have piled up
                    # ids to feed again: catch up with a plain step, which yields a token of its
                    # own, rather than widen every pass. Then draft as the policy asked.
                    yield from self._plain_stretch(
                        context, config, keys, progress, requested, once=True
                    )
                    progress.decided = requested
                    continue

                # Draft, verify all guesses in one target pass, accept, roll back.
                key = keys.next() if keys is not None else None
                draft = drafter.propose(context, k, params, key, self.policy.confidence_floor)
                draft = self._cut_at_eos(draft)
                drafted = time.perf_counter()

                guesses = draft.tokens
                # Ids after a restored checkpoint are fed again here, in the same pass.
                pending = context[len(target) :]
                target.checkpoint()
                logits = target.forward(pending + guesses)
                logits = logits[-(len(guesses) + 1) :, : self.vocab_size]
                verdict = self._verify(logits, draft, params, keys)
                verified = time.perf_counter()

                n = verdict.accepted
                # Keep the kept guesses (the new token is fed next cycle); a recurrent model
                # returns to the checkpoint instead and feeds the kept ones again then.
                target.trim_to(len(context) + n)
                context += guesses[:n] + [verdict.token]
                drafter.rollback(len(context) - 1)
                cycle = Cycle(
                    requested=requested,
                    proposed=len(guesses),
                    accepted=n,
                    draft_s=drafted - begun,
                    verify_s=verified - drafted,
                    overhead_s=time.perf_counter() - verified,
                    draft_steps=draft.steps,
                    draft_fed=draft.fed,
                    draft_source=draft.source if guesses else None,
                    fed=len(pending) + len(guesses),
                    refed=len(pending) - 1,
                )
                self.policy.observe(cycle)
                # The record comes first: a consumer that stops mid-cycle has still counted it.
                yield cycle
                for i, token in enumerate(guesses[:n] + [verdict.token]):
                    progress.delivered += 1
                    yield token, (Source.DRAFT if i < n else Source.TARGET)
        finally:
            # Closed early (EOS, stop string, cancel, Ctrl-C): drop what was not delivered.
            keep = len(prompt) + progress.delivered - 1
            target.settle(keep, context[keep] if progress.delivered else None)
            if drafter is not None:
                drafter.rollback(keep)

    def _plain_stretch(
        self,
        context: list[int],
        config: GenerationConfig,
        keys: KeyStream | None,
        progress: _Progress,
        requested: int,
        once: bool = False,
    ) -> Iterator[Cycle | tuple[int, Source]]:
        """Plain target steps until the policy wants to draft again (or max_tokens); `once`:
        a single step.

        Pipelined as mlx-lm's generate_step: the next step is queued before this one's token
        is read back. Meanwhile the target's cache runs one token ahead of the invariant; the
        stretch's last step, or the caller's `finally`, brings it back.
        """
        params = config.sampling
        begun = time.perf_counter()
        pending = context[len(self.target) :]
        token = self._plain_step(pending, params, keys)
        mx.async_eval(token)
        while True:
            following = None
            if progress.delivered + 1 < config.max_tokens and not once:
                if self.drafter is not None:
                    progress.decided = self.policy.draft_length() or None
                if progress.decided is None:
                    following = self._plain_step(token, params, keys)
                    mx.async_eval(following)
            value = token.item()
            now = time.perf_counter()
            context.append(value)
            cycle = Cycle(
                requested=requested,
                proposed=0,
                accepted=0,
                draft_s=0.0,
                verify_s=now - begun,
                overhead_s=0.0,
                draft_steps=0,
                draft_fed=0,
                fed=len(pending),
                refed=len(pending) - 1,
            )
            begun, pending = now, [value]
            if self.drafter is not None:
                self.policy.observe(cycle)
            yield cycle
            progress.delivered += 1
            yield value, Source.TARGET
            if following is None:
                return
            token, requested = following, 0

    def _plain_step(
        self, ids: list[int] | mx.array, params: SamplingParams, keys: KeyStream | None
    ) -> mx.array:
        """Feed ids to the target; the next token as an unevaluated (1,) array."""
        logits = self.target.forward(ids)[-1:, : self.vocab_size]
        if params.greedy:
            return mx.argmax(logits, axis=-1)
        return sample(probabilities(logits, params), keys.next())

    def _cut_at_eos(self, draft: Draft) -> Draft:
        for i, token in enumerate(draft.tokens):
            if token in self.eos_ids:  # nothing after an end of sequence can be used
                q = draft.q[: i + 1] if draft.q is not None else None
                return replace(draft, tokens=draft.tokens[: i + 1], q=q)
        return draft

    def _verify(
        self, logits: mx.array, draft: Draft, params: SamplingParams, keys: KeyStream | None
    ) -> Verdict:
        if params.greedy:
            return verify_greedy(logits, draft.tokens)
        return verify_sampled(probabilities(logits, params), draft.q, draft.tokens, keys.next())

    # -- events ----------------------------------------------------------------------------
    def generate(
        self,
        prompt: Sequence[int],
        config: GenerationConfig = GenerationConfig(),
        cancelled: Callable[[], bool] | None = None,
    ) -> Iterator[Event]:
        """Yield Token and Cycle events, then one Done.

        The prompt must leave room in `config.context_length`; the answer ends at it.

        `cancelled` is polled after every token; when it returns True the generation ends
        with finish_reason 'cancelled' (closing the generator works too, without a Done).
        """
        prompt = [int(t) for t in prompt]
        if not prompt:
            raise MacspecError("the prompt is empty")
        # The context window bounds the answer as max_tokens does, with its own reason.
        context_room = None
        if config.context_length is not None:
            context_room = config.context_length - len(prompt)
            if context_room < 1:
                raise MacspecError(
                    f"the prompt is {len(prompt)} tokens and the model's context holds "
                    f"{config.context_length}; shorten it"
                )
            if context_room < config.max_tokens:
                config = replace(config, max_tokens=context_room)
            else:
                context_room = None  # max_tokens comes first
        stats = Stats(prompt_tokens=len(prompt))
        keys = None if config.sampling.greedy else KeyStream(config.seed)
        detokenizer = self.tokenizer.detokenizer
        detokenizer.reset()
        scanner = StopScanner(config.stop_strings)
        tokens: list[int] = []
        sources: list[Source] = []
        finish, stopped_at = "length", None
        started = time.perf_counter()
        first_at = last_at = None

        raw = self._cycles(prompt, config, keys, stats)
        try:
            for item in raw:
                if isinstance(item, Cycle):
                    stats.add_cycle(item)
                    yield item
                    continue
                token, source = item
                last_at = time.perf_counter()
                if first_at is None:
                    first_at = last_at
                if token in self.eos_ids:
                    finish = "stop"
                    break
                tokens.append(token)
                sources.append(source)
                detokenizer.add_token(token)
                text, hit = scanner.feed(detokenizer.text)
                yield Token(token, text, source)
                if hit:
                    finish, stopped_at = "stop_string", scanner.released
                    break
                if len(tokens) >= config.max_tokens:
                    finish = "length" if context_room is None else "context"
                    break
                if cancelled is not None and cancelled():
                    finish = "cancelled"
                    break
        finally:
            raw.close()

        detokenizer.finalize()
        full_text = detokenizer.text
        tail = "" if stopped_at is not None else scanner.flush(full_text)
        ended = time.perf_counter()
        stats.generated_tokens = len(tokens)
        stats.elapsed_s = ended - started
        if first_at is not None:
            stats.ttft_s = first_at - started
            stats.decode_s = last_at - first_at
        yield Done(
            finish_reason=finish,
            text=full_text[:stopped_at] if stopped_at is not None else full_text,
            tail=tail,
            tokens=tokens,
            sources=sources,
            stats=stats,
        )
