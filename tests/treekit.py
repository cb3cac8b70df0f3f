"""Shared by the tree tests and scripts/figures/tree_figures.py: fixtures whose drafters give
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


class TornBlock(OracleBlock):
    """A block drafter that knows where it is unsure, as a trained one does: at each position,
    by a fair coin, its marginal is sharp on the target's own token (logit `sharp`), or torn
    between that token and another one (`torn` logits each, the other one as likely first).
    A tree that branches where the marginals are torn (DDTree) keeps more than a fixed shape,
    which cannot tell those positions from the others."""

    def __init__(self, model, target, answers: dict, sharp=9.0, torn=4.0, seed: int = 0):
        super().__init__(model, target, answers, sharp, seed)
        self.torn = torn

    def block_logits(self, context, k):
        block = super().block_logits(context, k)
        if block is None:
            return None
        logits, fed = block
        n = logits.shape[0]
        self.key, coin, other, jitter = mx.random.split(self.key, 4)
        torn = mx.random.bernoulli(0.5, (n, 1), key=coin)
        right = mx.argmax(logits, axis=-1)
        wrong = (right + 1 + mx.random.randint(0, self.vocab - 1, (n,), key=other)) % self.vocab
        hot = mx.zeros_like(logits)
        hot[mx.arange(n), wrong] = self.torn + 0.5 * mx.random.normal((n,), key=jitter)
        # Torn rows: the right token's logit down to `torn`, a wrong one's up to about it.
        down = mx.zeros_like(logits)
        down[mx.arange(n), right] = self.sharp - self.torn
        return mx.where(torn, logits - down + hot, logits), fed
