"""The answer layer over the raw loop: token ids become text, stop strings and end reasons
are applied, and the generation's stats are gathered into one `Done` event.

The raw loop (`Engine.cycles`, loop.py) only drafts, verifies and rolls back; everything a
reader of the answer sees is decided here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from macspec.engine.config import GenerationConfig
from macspec.engine.events import Cycle, Done, Event, Source, Token
from macspec.engine.sampling import Randomness, choose_sampler
from macspec.engine.stats import Stats
from macspec.engine.stops import StopScanner
from macspec.engine.wired import wired_limit
from macspec.errors import MacspecError

if TYPE_CHECKING:
    from macspec.engine.loop import Engine


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
    if not prompt:
        raise MacspecError("the prompt is empty")
    config, by_context = config.within_context(len(prompt))
    stats = Stats(prompt_tokens=len(prompt))
    rng = None
    if not config.sampling.greedy:
        rng = Randomness(choose_sampler(config.sampler, config.seed), config.seed)
        stats.sampler = rng.sampler
    detokenizer = engine.tokenizer.detokenizer
    detokenizer.reset()
    scanner = StopScanner(config.stop_strings)
    tokens: list[int] = []
    sources: list[Source] = []
    finish, stopped_at = "length", None
    started = time.perf_counter()
    first_at = last_at = None
    any_requested = False  # whether the policy ever asked the drafter for guesses

    raw = engine.cycles(prompt, config, rng, stats)
    with wired_limit():  # Metal: the weights stay wired while generating
        try:
            for item in raw:
                if isinstance(item, Cycle):
                    stats.add_cycle(item)
                    any_requested = any_requested or item.requested > 0
                    yield item
                    continue
                token, source = item
                last_at = time.perf_counter()
                if first_at is None:
                    first_at = last_at
                if token in engine.eos_ids:
                    finish = "stop"
                    stats.end_tokens = 1
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
                    finish = "context" if by_context else "length"
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
    reason = getattr(engine.policy, "reason", None)  # --draft auto: which drafter, and why
    if reason is not None:
        stats.drafter_choice = reason
    stats.tree_note = getattr(engine.policy, "tree_note", None)  # --draft-tree: why chains
    if engine.drafter is not None and not stats.draft_proposed and stats.target_passes:
        stats.plain_reason = (
            "plain: guessing does not pay here"
            if not any_requested
            else "no guesses worth verifying"
        )
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
