"""Shared by the lossless checks: prompts, mlx-lm's target-only reference, the final event."""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.generate import generate_step

from macspec.engine.events import Done

EOS = 257  # the tiny tokenizer's end of sequence (tests/tiny.py)

PROMPTS = [
    "hello world",
    "def f(x):",
    "The quick brown fox jumps over the lazy dog",
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,",
    "import os\nimport sys\n",
    "Once upon a time",
    "SELECT * FROM users WHERE id = 1;",
    "<html><body>",
    "for i in range(10):",
    "a",
    "zzzz",
    "Speculative decoding is lossless when",
    "print('hi')",
    "2 + 2 =",
    "The capital of France",
    "lorem ipsum dolor sit amet, consectetur",
    "class Foo:\n    def",
    '{"key": ',
    "# TODO:",
    "MLX on a Mac",
]


def reference(model, prompt: list[int], max_tokens: int) -> list[int]:
    """mlx-lm greedy decoding of the target alone, cut at (and without) EOS."""
    out = []
    for token, _ in generate_step(mx.array(prompt), model, max_tokens=max_tokens):
        if token == EOS:
            break
        out.append(token)
    return out


def done_of(events) -> Done:
    """The run's last event, which must be its Done."""
    last = list(events)[-1]
    assert isinstance(last, Done)
    return last
