"""Tiny models for the chat tests: readable output, counted and scripted forward passes.

`Printable` limits a random llama's output to lowercase letters, spaces and punctuation,
so transcripts and snapshots show text instead of random bytes. Its counters and hooks
(tokens fed, a crash or a slow-down after N passes) let tests watch the caches at work.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx_lm.models import llama
from tiny import VOCAB, noisy_copy, random_model, tokenizer, write_tokenizer

from macspec.engine.drafters.model import ModelDrafter
from macspec.engine.generate.loop import Engine
from macspec.engine.policy.length import FixedPolicy

ALPHABET = "abcdefghijklmnopqrstuvwxyz .,"
EOS = 257


class Printable(llama.Model):
    """A llama whose logits are masked to ALPHABET (+ EOS), with counting and hooks."""

    def __call__(self, inputs, cache=None, input_embeddings=None):
        self.passes += 1
        self.fed += int(inputs.shape[-1])
        if self.crash_after is not None and self.passes > self.crash_after:
            raise RuntimeError("simulated crash in the model")
        if self.slow_after is not None and self.passes > self.slow_after:
            self.slowed.set()
            time.sleep(self.slow_s)
        return super().__call__(inputs, cache=cache) + self._bias

    def reset_counts(self) -> None:
        self.passes = self.fed = 0


def printable(model: llama.Model, tok, eos_bias: float = 0.0) -> Printable:
    copy = Printable(model.args)
    copy.update(model.parameters())
    bias = np.full((VOCAB,), -1e4, dtype=np.float32)
    bias[[tok.encode(c, add_special_tokens=False)[0] for c in ALPHABET]] = 0.0
    bias[tok.encode(" ", add_special_tokens=False)[0]] = 2.0  # words, not one long string
    bias[EOS] = eos_bias
    # Plain attributes (not parameters): ints, an Event and the mask.
    object.__setattr__(copy, "_bias", mx.array(bias))
    copy.passes = copy.fed = 0
    copy.crash_after = copy.slow_after = None
    copy.slow_s = 0.02
    object.__setattr__(copy, "slowed", threading.Event())
    return copy


def tiny_tokenizer(folder: Path):
    write_tokenizer(folder)
    return tokenizer(folder)


def tiny_pair(tok, seed: int = 0, noise: float = 0.05, eos_bias: float = 0.0):
    """(target, draft): a random target and a noisy copy of it that often guesses right."""
    target = random_model(seed, scale=3.0)
    draft = noisy_copy(target, noise, seed + 1)
    return printable(target, tok, eos_bias), printable(draft, tok, eos_bias)


def tiny_engine(tok, target, draft, k: int = 3, drafter_of=None) -> Engine:
    """A speculative engine with a fixed draft length (deterministic cycles); `drafter_of`
    wraps the model drafter (a hybrid drafter, say)."""
    drafter = ModelDrafter(draft)
    return Engine(target, tok, drafter_of(drafter) if drafter_of else drafter, FixedPolicy(k))
