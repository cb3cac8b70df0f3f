"""Plain decoding stretches of the guess-and-verify loop (loop.py): the target alone, a
step at a time, pipelined as mlx-lm's generate_step, until the policy wants to draft again."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from macspec.engine.core.config import GenerationConfig
from macspec.engine.core.events import Cycle, Source
from macspec.engine.core.sampling import Randomness, SamplingParams, probabilities

CLEAR_CACHE_EVERY = 256
"""Decoded ids between emptyings of MLX's buffer cache (mlx-lm's generate does the same)."""


@dataclass
class Progress:
    """Where a generation stands, shared by the loop and its plain stretches."""

    delivered: int = 0
    """Ids handed to the consumer; on exit the caches keep only those."""
    decided: int | None = None
    """A draft length the policy chose ahead, during a plain stretch."""


def plain_stretch(
    engine: Any,
    context: list[int],
    config: GenerationConfig,
    rng: Randomness | None,
    progress: Progress,
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
    pending = context[len(engine.target) :]
    position = len(context)  # of the token this step produces
    token = plain_step(engine, pending, params, rng, position)
    mx.async_eval(token)
    while True:
        following = None
        if progress.delivered + 1 < config.max_tokens and not once:
            if engine.drafting():
                progress.decided = engine.policy.draft_length() or None
            if progress.decided is None:
                following = plain_step(engine, token, params, rng, position + 1)
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
        if engine.drafter is not None:
            engine.policy.observe(cycle)
        yield cycle
        progress.delivered += 1
        yield value, Source.TARGET
        if progress.delivered % CLEAR_CACHE_EVERY == 0:
            mx.clear_cache()  # MLX's buffer cache, as mlx-lm's generate does
        if following is None:
            return
        token, requested, position = following, 0, position + 1


def plain_step(
    engine: Any,
    ids: list[int] | mx.array,
    params: SamplingParams,
    rng: Randomness | None,
    position: int,
) -> mx.array:
    """Feed ids to the target; its token at `position` as an unevaluated (1,) array."""
    logits = engine.target.forward(ids)[-1:, : engine.vocab_size]
    if params.greedy:
        return mx.argmax(logits, axis=-1)
    return rng.pick(probabilities(logits, params), position)
