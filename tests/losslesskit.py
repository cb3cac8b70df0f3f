"""Shared by the lossless checks: prompts, mlx-lm's target-only reference, the final event."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import mlx.core as mx
from mlx_lm.generate import generate_step

from macspec.engine.core.events import Done
from macspec.engine.generate.loop import GenerationConfig

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


def reference(model, prompt: list[int], max_tokens: int, eos=frozenset({EOS})) -> list[int]:
    """mlx-lm greedy decoding of the target alone, cut at (and without) EOS."""
    out = []
    for token, _ in generate_step(mx.array(prompt), model, max_tokens=max_tokens):
        if token in eos:
            break
        out.append(token)
    return out


@contextmanager
def passes_of(model) -> Iterator[list[int]]:
    """The ids of each forward pass of `model` (not of others of its class) in the block."""
    calls: list[int] = []
    original = type(model).__call__

    def counted(self, *args, **kwargs):
        if self is model:
            calls.append(args[0].shape[1])
        return original(self, *args, **kwargs)

    type(model).__call__ = counted
    try:
        yield calls
    finally:
        type(model).__call__ = original


def counted_run(target, engine, prompt: list[int], max_tokens: int) -> tuple[list[int], list]:
    """Run `engine` greedily on `prompt`, counting the target model's forward calls: (ids fed
    per call, the run's events)."""
    with passes_of(target) as calls:
        events = list(engine.generate(prompt, GenerationConfig(max_tokens=max_tokens)))
    return calls, events


def done_of(events) -> Done:
    """The run's last event, which must be its Done."""
    last = list(events)[-1]
    assert isinstance(last, Done)
    return last


@dataclass
class Tally:
    """Counts of an engine's greedy runs over prompts, summed (the figures scripts print them)."""

    proposed: int = 0
    accepted: int = 0
    passes: int = 0
    generated: int = 0
    fed: int = 0
    refed: int = 0
    identical: int = 0
    """Runs whose tokens equal mlx-lm's target-alone reference."""

    @property
    def acceptance(self) -> str:
        """'0.61 of 696', or '-' when nothing was proposed."""
        return f"{self.accepted / self.proposed:.2f} of {self.proposed}" if self.proposed else "-"


def tally(engine, prompts: list[list[int]], wants: list[list[int]], max_tokens: int) -> Tally:
    """Run `engine` greedily on every prompt, summing its counts and checking each output."""
    counts = Tally()
    for prompt, want in zip(prompts, wants):
        done = done_of(engine.generate(prompt, GenerationConfig(max_tokens=max_tokens)))
        s = done.stats
        counts.proposed += s.draft_proposed
        counts.accepted += s.draft_accepted
        counts.passes += s.target_passes
        counts.generated += s.generated_tokens
        counts.fed += s.target_fed_tokens
        counts.refed += s.refed_tokens
        counts.identical += done.tokens == want
    return counts


REPEATING = "one two three four five one two three four five one two three"
"""A raw prompt that lookup drafts on (its continuation repeats it)."""


def assert_run_lookup_lossless(path, capsys, max_tokens: int = 24) -> None:
    """`macspec run --model FILE --raw --json` on REPEATING answers max_tokens with
    `--no-draft`, and the same with lookup drafts, which drafted (MACSPEC_HOME set by the
    caller)."""
    from macspec.cli import main

    records = {}
    for draft in ("--no-draft", "--draft=lookup"):
        args = ["run", "--model", str(path), "--raw", "--max-tokens", str(max_tokens), "--json"]
        assert main([*args, draft, REPEATING]) == 0, capsys.readouterr().err
        records[draft] = json.loads(capsys.readouterr().out)
    assert len(records["--no-draft"]["tokens"]) == max_tokens
    assert records["--draft=lookup"]["tokens"] == records["--no-draft"]["tokens"]
    assert records["--draft=lookup"]["stats"]["draft_proposed"] > 0  # drafted, rolled back


def assert_batched_rows_lossless(model, tok, max_tokens: int = 12) -> None:
    """Three rows of `serve`'s batch (each its own length in one cache; prefilled in chunks of 5
    between steps; lookup drafts of 3) each answer as the target alone, and shared passes."""
    from macspec.engine.batch.engine import BatchEngine
    from macspec.engine.drafters.lookup import LookupDrafter
    from macspec.engine.policy.length import FixedPolicy

    prompts = [[5, 9, 17, 300, 5, 9, 17, 300, 5, 9], [44, 12, 99], [7] * 12]
    wants = [reference(model, p, max_tokens, eos=frozenset()) for p in prompts]
    engine = BatchEngine(model, tok, lambda: LookupDrafter(), lambda d: FixedPolicy(3))
    rows = [engine.admit(p, GenerationConfig(max_tokens=max_tokens)) for p in prompts]
    for row in rows:
        while not engine.prefill_step(row, chunk=5):
            engine.step()
    while any(row.done is None for row in rows):
        engine.step()
    assert [row.done.tokens for row in rows] == wants
    assert max(row.done.stats.rows_per_pass for row in rows) > 1
