"""Shared by the tree tests and scripts/tree_figures.py: fixtures whose drafters give
candidates (a draft model, an MTP head on an attention target, a block drafter with known
marginals)."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import tiny

from macspec.engine.drafters.dflash import DFlashDrafter
from macspec.engine.drafters.mtp import MTPHead


def mtp_head(target: nn.Module, noise: float = 0.02) -> MTPHead:
    """An MTP head of the target's own architecture (macspec's format for targets other than
    Qwen3.5) that mostly predicts what a near-bigram target predicts next."""
    head = MTPHead(tiny.CONFIGS[id(target)])
    head.load_weights(list(tiny.mtp_weights(target, noise).items()))
    mx.eval(head.parameters())
    return head


class OracleBlock(DFlashDrafter):
    """A block drafter whose marginal at each position puts `sharp` logits on the target's own
    greedy token there, plus Gaussian noise: a stand-in for a trained DFlash drafter, whose
    marginals are as sharp or as flat as asked. `answers`: the target's greedy answer to each
    prompt (a tuple of ids); a context that continues none has nothing to draft from."""

    def __init__(self, model, target, answers: dict, sharp: float, seed: int = 0):
        super().__init__(model, target)
        self.answers, self.sharp = answers, sharp
        self.vocab = target.args.vocab_size
        self.key = mx.random.key(seed)

    def block_logits(self, context, k):
        ahead = []
        for prompt, answer in self.answers.items():
            if tuple(context[: len(prompt)]) == prompt:
                done = len(context) - len(prompt)
                ahead = list(answer[done : done + min(k, self.max_guesses)])
                break
        if not ahead:
            return None
        self.key, key = mx.random.split(self.key)
        logits = mx.random.normal((len(ahead), self.vocab), key=key)
        hot = mx.zeros((len(ahead), self.vocab))
        hot[mx.arange(len(ahead)), mx.array(ahead)] = self.sharp
        return logits + hot, 1
