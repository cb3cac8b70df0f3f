"""Where guesses come from. A drafter proposes up to k next tokens for the target to verify.

The engine owns the committed sequence (`context`); a drafter only has to guess its next
tokens and, after each cycle, `rollback` to the part of it that survived verification.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import mlx.core as mx
import mlx.nn as nn

from macspec.engine.cached import CachedModel
from macspec.engine.sampling import SamplingParams, probabilities, sample


@dataclass
class Draft:
    """One cycle's guesses."""

    tokens: list[int]
    """The guessed ids, in order (possibly fewer than asked for)."""
    q: mx.array | None = None
    """(len(tokens), V) distributions the guesses were drawn from; None: deterministic guesses."""
    steps: int = 0
    """Forward passes the drafter ran (its cost, for the draft-length policy)."""
    fed: int = 0
    """Ids the drafter's model processed, catch-up after plain target steps included."""
    source: str = "model"
    """Which kind of guess this is ('model', 'lookup'), for per-source acceptance."""


class Drafter(Protocol):
    """The interface the engine drafts through."""

    name: str
    """Shown in stats: 'model', 'lookup', ..."""

    def start(self, prompt: Sequence[int]) -> None:
        """A new generation begins with this prompt; prefill whatever state is reusable."""

    def propose(
        self,
        context: Sequence[int],
        k: int,
        params: SamplingParams,
        key: mx.array | None,
        confidence_floor: float | None,
    ) -> Draft:
        """Guess up to k tokens after `context` (prompt + all committed tokens).

        With a `confidence_floor`, stop before a guess whose top probability falls below it.
        `key` is set when sampling (params.temperature > 0).
        """

    def rollback(self, keep: int) -> None:
        """Forget state beyond the first `keep` ids of the context (rejected guesses)."""


class ModelDrafter:
    """Guesses with a small language model that shares the target's tokenizer."""

    name = "model"

    def __init__(self, model: nn.Module, vocab_size: int | None = None, cache: list | None = None):
        self.state = CachedModel(model, name="draft model", cache=cache)
        self.state.require_rollback()
        self.vocab_size = vocab_size
        """Logits beyond this id are cut off, so p and q share one support."""

    def start(self, prompt: Sequence[int]) -> None:
        remaining = self.state.reuse(prompt)
        self.state.prefill(remaining[:-1])
        self.state.checkpoint("prompt")

    def rollback(self, keep: int) -> None:
        self.state.trim_to(keep)

    def propose(
        self,
        context: Sequence[int],
        k: int,
        params: SamplingParams,
        key: mx.array | None,
        confidence_floor: float | None,
    ) -> Draft:
        self.state.checkpoint()  # a recurrent draft returns here after its guesses are judged
        feed: Sequence[int] | mx.array = context[len(self.state) :]
        fed = len(feed)
        guesses: list[mx.array] = []
        dists: list[mx.array] = []
        keys = mx.random.split(key, k) if key is not None else None
        steps = 0
        for i in range(k):
            steps += 1
            logits = self.state.forward(feed)[-1:, : self.vocab_size]
            if params.greedy:
                q, token = None, mx.argmax(logits, axis=-1)
            else:
                q = probabilities(logits, params)
                token = sample(q, keys[i])
            if confidence_floor is not None:
                dist = q if q is not None else mx.softmax(logits.astype(mx.float32), axis=-1)
                if dist.max().item() < confidence_floor:
                    break
            guesses.append(token)
            if q is not None:
                dists.append(q)
            if i + 1 < k:
                # The last guess needs no forward pass of its own: the target scores it.
                feed = token.astype(mx.uint32)
                fed += 1
                mx.async_eval(feed)
        tokens = mx.concatenate(guesses).tolist() if guesses else []
        q = mx.concatenate(dists, axis=0) if dists else None
        if q is not None:
            mx.eval(q)
        return Draft(tokens=tokens, q=q, steps=steps, fed=fed, source=self.name)


def truncate_at_floor(
    guesses: list[tuple[mx.array, mx.array]],
    dists: list[mx.array],
    confidence_floor: float | None,
    params: SamplingParams,
    fed: int,
    source: str,
) -> Draft:
    """A Draft from guesses still on the device, cut before the first one the drafter was less
    sure of than the floor. Tokens and confidences are read back in one go: one wait.

    guesses: (token (1,), logits (1, V) when greedy else q (1, V)) per step; dists: the q rows.
    """
    tokens = mx.concatenate([token for token, _ in guesses])
    kept = len(guesses)
    if confidence_floor is not None:
        rows = mx.concatenate([row for _, row in guesses], axis=0)
        if params.greedy:
            rows = mx.softmax(rows.astype(mx.float32), axis=-1)
        top = rows.max(axis=-1)
        mx.eval(tokens, top)
        below = [i for i, p in enumerate(top.tolist()) if p < confidence_floor]
        kept = below[0] if below else kept
    ids = tokens.tolist()[:kept]
    q = mx.concatenate(dists[:kept], axis=0) if dists and kept else None
    return Draft(tokens=ids, q=q, steps=len(guesses), fed=fed, source=source)
