"""Do batched passes give the very logits a single row gets? Measured on the test fixtures.

For each architecture (llama, qwen3_5 hybrid, gemma3 sliding window, mamba2, lfm2), four rows
of different lengths are decoded greedily, plainly, in a BatchEngine (ragged rows, rows
joining late); every row's logits at every step are compared with the same row decoded alone
by mlx-lm's own generate_step. Printed: the largest logit difference, how many steps differ at
all, and how many argmaxes flip (with the logit gap at the first flip).

    python scripts/figures/batch_numerics.py [--tokens 24]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import mlx.core as mx

sys.path.insert(0, str(Path(__file__).parents[2] / "tests"))

import tiny  # noqa: E402
from losslesskit import PROMPTS  # noqa: E402
from mlx_lm.generate import generate_step  # noqa: E402

from macspec.engine.batch.engine import BatchEngine  # noqa: E402
from macspec.engine.generate.loop import GenerationConfig  # noqa: E402

KINDS = ["llama", "qwen3_5", "gemma3_text", "mamba2", "lfm2"]


def alone_logits(model, prompt: list[int], tokens: int) -> list[mx.array]:
    out = []
    for _, logprobs in generate_step(mx.array(prompt), model, max_tokens=tokens):
        out.append(logprobs)
    return out


def batched_logits(engine: BatchEngine, prompts, tokens: int) -> dict[int, list[mx.array]]:
    """Every row's log-probabilities at each step, caught at the model's output."""
    seen: dict[int, list[mx.array]] = {i: [] for i in range(len(prompts))}
    model = engine.model
    forward = type(model).__call__
    order: list[int] = []

    def catch(self, inputs, *args, **kwargs):
        logits = forward(self, inputs, *args, **kwargs)
        cache = kwargs.get("cache", args[0] if args else None)
        if cache is engine.caches:  # a batched pass (a row prefilled alone is not one)
            for i, row in enumerate(order):
                width = len(engine.rows[i].context) - engine.rows[i].fed
                last = logits[i, width - 1]
                seen[row].append(last - mx.logsumexp(last))
        return logits

    type(model).__call__ = catch
    try:
        rows = []
        for i, prompt in enumerate(prompts):
            rows.append(engine.admit(prompt, GenerationConfig(max_tokens=tokens)))
            while not engine.prefill_step(rows[-1]):
                pass
            order.append(i)
            if i % 2:
                engine.step()
        while any(r.done is None for r in rows):
            order[:] = [i for i, r in enumerate(rows) if r in engine.rows]
            engine.step()
    finally:
        type(model).__call__ = forward
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=24)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp())
    tiny.write_tokenizer(folder)
    tok = tiny.tokenizer(folder)
    prompts = [tok.encode(text) for text in PROMPTS[:4]]
    for kind in KINDS:
        model = (
            tiny.random_model(0, scale=3.0)
            if kind == "llama"
            else tiny.arch_model(kind, 0, scale=3.0)
        )
        engine = BatchEngine(model, tok)
        batched = batched_logits(engine, prompts, args.tokens)
        worst, differing, flips, first_gap, steps = 0.0, 0, 0, None, 0
        for i, prompt in enumerate(prompts):
            for mine, theirs in zip(batched[i], alone_logits(model, prompt, args.tokens)):
                steps += 1
                gap = mx.abs(mine - theirs).max().item()
                worst = max(worst, gap)
                differing += gap > 0
                if mx.argmax(mine).item() != mx.argmax(theirs).item():
                    flips += 1
                    if first_gap is None:
                        top = mx.sort(theirs)[-2:]
                        first_gap = (top[1] - top[0]).item()
        note = f", first flip at a top-2 gap of {first_gap:.2e}" if first_gap is not None else ""
        print(
            f"{kind}: {steps} steps, largest logit difference {worst:.2e}, "
            f"{differing} steps differ, {flips} argmax flips{note}"
        )


if __name__ == "__main__":
    main()
