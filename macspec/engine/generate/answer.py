"""The answer layer over the raw loop: token ids become text, stop strings and end reasons
are applied, and the generation's stats are gathered into one `Done` event.

The raw loop (`Engine.cycles`, loop.py) only drafts, verifies and rolls back; everything a
reader of the answer sees is decided here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

from macspec.engine.core.config import GenerationConfig
from macspec.engine.core.events import Cycle, Done, Event, Prefill, Source, Token
from macspec.engine.core.sampling import Randomness, choose_sampler
from macspec.engine.core.stats import Stats
from macspec.engine.core.stops import StopScanner
from macspec.engine.core.wired import wired_limit
from macspec.engine.drafters.protocol import Drafter
from macspec.engine.generate.detokenize import answer_detokenizer
from macspec.engine.policy.length import DraftPolicy
from macspec.errors import EMPTY_PROMPT, MacspecError, is_empty_prompt


class Engine(Protocol):
    """What an answer reads of the engine whose raw cycles it turns into text (the loop's
    `Engine`, which imports this module; the batch engine feeds `AnswerState` itself)."""

    tokenizer: Any
    eos_ids: frozenset[int]
    drafter: Drafter | None
    policy: DraftPolicy | None

    def cycles(
        self, prompt: list[int], config: GenerationConfig, rng: Randomness | None, stats: Stats
    ) -> Iterator[Prefill | Cycle | tuple[int, Source]]:
        """The raw loop: Prefill, Cycle records and (token id, source) pairs."""


class AnswerState:
    """One answer as its ids come: text through the detokenizer, stop strings, the end
    reasons (EOS, a stop string, max tokens, the context window, cancel) and the stats.

    The single-sequence loop (`generate` below) and the batch engine (batch.py) both feed it,
    so a row of a batch ends and reads exactly as the same request alone.
    """

    def __init__(
        self,
        engine: Engine,
        prompt: list[int],
        config: GenerationConfig,
        cancelled: Callable[[], bool] | None = None,
    ):
        if is_empty_prompt(prompt):
            raise MacspecError(f"{EMPTY_PROMPT} (no ids)")
        self.config, self.by_context = config.within_context(len(prompt))
        self.stats = Stats(prompt_tokens=len(prompt))
        self.rng = None
        if not self.config.sampling.greedy:
            self.rng = Randomness(choose_sampler(config.sampler, config.seed), config.seed)
            self.stats.sampler = self.rng.sampler
        self.eos_ids = engine.eos_ids
        self.detokenizer = answer_detokenizer(engine.tokenizer, self.config.continuation)
        self.scanner = StopScanner(self.config.stop_strings)
        self.cancelled = cancelled
        self.tokens: list[int] = []
        self.sources: list[Source] = []
        self.finish: str | None = None
        """Why the answer ended, once it has: no more ids are taken then."""
        self.stopped_at: int | None = None
        self.started = time.perf_counter()
        self.first_at: float | None = None
        self.last_at: float | None = None
        self.first_pass = 0
        """The target pass that brought the first token (its other ids came at no extra time)."""
        self.any_requested = False  # whether the policy ever asked the drafter for guesses

    def cycle(self, cycle: Cycle) -> None:
        self.stats.add_cycle(cycle)
        self.any_requested = self.any_requested or cycle.requested > 0

    def token(self, token: int, source: Source) -> Token | None:
        """The event for one id (None for the end of sequence); sets `finish` when the answer
        ends with it (then `check_cancelled`, after the event is handed on)."""
        self.last_at = time.perf_counter()
        if self.first_at is None:
            self.first_at = self.last_at
            self.first_pass = self.stats.target_passes
        elif token not in self.eos_ids and self.stats.target_passes != self.first_pass:
            self.stats.steady_tokens += 1  # ids the first token's pass did not bring
        if token in self.eos_ids:
            self.finish = "stop"
            self.stats.end_tokens = 1
            return None
        self.tokens.append(token)
        self.sources.append(source)
        self.detokenizer.add_token(token)
        text, hit = self.scanner.feed(self.detokenizer.text)
        if hit:
            self.finish, self.stopped_at = "stop_string", self.scanner.released
        elif len(self.tokens) >= self.config.max_tokens:
            self.finish = "context" if self.by_context else "length"
        return Token(token, text, source)

    def check_cancelled(self) -> bool:
        """Polled after each token is handed on: a cancel ends the answer there."""
        if self.finish is None and self.cancelled is not None and self.cancelled():
            self.finish = "cancelled"
        return self.finish is not None

    def done(self, engine) -> Done:
        """The last event (ended by `finish`, or 'length' when the ids ran out)."""
        self.detokenizer.finalize()
        full_text = self.detokenizer.text
        stopped_at = self.stopped_at
        tail = "" if stopped_at is not None else self.scanner.flush(full_text)
        stats = self.stats
        stats.generated_tokens = len(self.tokens)
        stats.elapsed_s = time.perf_counter() - self.started
        policy = engine.policy
        if policy is not None and policy.reason is not None:  # --draft auto: which, and why
            stats.drafter_choice = policy.reason
        stats.tree_note = policy.tree_note if policy is not None else None  # why chains
        stats.price_note = policy.price_note() if policy is not None else None
        if not engine.guard.on:  # a drafter failed: it was switched off, and why
            stats.plain_reason = engine.guard.reason
        elif engine.drafter is not None and not stats.draft_proposed and stats.target_passes:
            stats.plain_reason = (
                "plain: guessing does not pay here"
                if not self.any_requested
                else "no guesses worth verifying"
            )
        if self.first_at is not None:
            stats.ttft_s = self.first_at - self.started
            stats.decode_s = self.last_at - self.first_at
        return Done(
            finish_reason=self.finish or "length",
            text=full_text[:stopped_at] if stopped_at is not None else full_text,
            tail=tail,
            tokens=self.tokens,
            sources=self.sources,
            stats=stats,
            stop_string=self.scanner.hit if stopped_at is not None else None,
        )


def generate(
    engine: Engine,
    prompt: Sequence[int],
    config: GenerationConfig,
    cancelled: Callable[[], bool] | None = None,
) -> Iterator[Event]:
    """Yield Token and Cycle events, then one Done.

    The prompt must leave room in `config.context_length`; the answer ends at it.

    `cancelled` is polled after every token; when it returns True the generation ends
    with finish_reason 'cancelled' (closing the generator works too, without a Done).
    """
    prompt = [int(t) for t in prompt]
    answer = AnswerState(engine, prompt, config, cancelled)
    raw = engine.cycles(prompt, answer.config, answer.rng, answer.stats)
    with wired_limit():  # Metal: the weights stay wired while generating
        try:
            for item in raw:
                if isinstance(item, (Prefill, Cycle)):
                    if isinstance(item, Cycle):
                        answer.cycle(item)
                    yield item
                    continue
                event = answer.token(*item)
                if event is not None:
                    yield event
                if answer.check_cancelled():
                    break
        finally:
            raw.close()
    yield answer.done(engine)
