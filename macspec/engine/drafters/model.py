"""The draft-model drafter: a small language model that shares the target's tokenizer."""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
import mlx.nn as nn

from macspec.engine.caches.cached import DEFAULT_CACHE, CachedModel, CacheOptions
from macspec.engine.core.sampling import Draws, SamplingParams, probabilities
from macspec.engine.drafters.protocol import Draft, Drafter


class ModelDrafter(Drafter):
    """Guesses with a small language model that shares the target's tokenizer."""

    name = "model"

    def __init__(
        self,
        model: nn.Module,
        vocab_size: int | None = None,
        cache: list | None = None,
        options: CacheOptions = DEFAULT_CACHE,
    ):
        self.state = CachedModel(model, name="draft model", cache=cache, options=options)
        self.state.require_rollback()
        self.vocab_size = vocab_size
        """Logits beyond this id are cut off, so p and q share one support."""

    def start(self, prompt: Sequence[int]) -> None:
        remaining = self.state.reuse(prompt)
        self.state.prefill(remaining[:-1])
        self.state.checkpoint("prompt")

    def rollback(self, keep: int) -> None:
        self.state.trim_to(keep)

    def caches(self) -> list[CachedModel]:
        return [self.state]

    def propose(
        self,
        context: Sequence[int],
        k: int,
        params: SamplingParams,
        draws: Draws | None,
        confidence_floor: float | None,
    ) -> Draft:
        self.state.checkpoint()  # a recurrent draft returns here after its guesses are judged
        feed: Sequence[int] | mx.array = context[len(self.state) :]
        fed = len(feed)
        steps: list[tuple[mx.array, mx.array]] = []
        for i in range(k):
            logits = self.state.forward(feed)[-1:, : self.vocab_size]
            if params.greedy:
                token, row = mx.argmax(logits, axis=-1), logits
            else:
                row = probabilities(logits, params)
                token = draws(row, i)
            steps.append((token, row))
            if i + 1 < k:
                # The last guess needs no forward pass of its own: the target scores it.
                feed = token.astype(mx.uint32)
                fed += 1
                mx.async_eval(feed)
        return device_draft(steps, params, confidence_floor, k, fed, self.name)


def device_draft(
    steps: list[tuple[mx.array, mx.array]],
    params: SamplingParams,
    confidence_floor: float | None,
    forward_passes: int,
    fed: int,
    source: str,
) -> Draft:
    """A Draft from guesses still on the device: nothing is read here.

    steps: (token (1,), logits (1, V) when greedy else q (1, V)) per guess.
    """
    if not steps:
        return Draft(tokens=[], steps=forward_passes, fed=fed, source=source)
    tokens = mx.concatenate([token for token, _ in steps]).astype(mx.uint32)
    rows = mx.concatenate([row for _, row in steps], axis=0)
    q = None if params.greedy else rows
    confidence = None
    if confidence_floor is not None:
        dist = rows if q is not None else mx.softmax(rows.astype(mx.float32), axis=-1)
        confidence = dist.max(axis=-1)
    return Draft(tokens, q, confidence, steps=forward_passes, fed=fed, source=source)
