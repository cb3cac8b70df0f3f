"""One training conversation of `macspec tune`: the prompt's ids, the target's answer and,
for distillation, the target's likeliest tokens at each answer position."""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx


@dataclass
class Example:
    """One training conversation: the prompt's ids, then the target's answer."""

    tokens: list[int]
    """Prompt ids followed by the answer's ids (and the end of sequence, if the target ended)."""
    offset: int
    """Where the answer starts: the loss counts predictions of tokens[offset:] only."""
    top_ids: mx.array | None = None
    """(answer length, top k) ids of the target's likeliest tokens at each answer position."""
    top_logprobs: mx.array | None = None
    """Their log-probabilities (the target's full softmax, not renormalised)."""

    @property
    def answer_length(self) -> int:
        return len(self.tokens) - self.offset
