"""What full fine-tuning costs against LoRA, by draft size: the measurement behind the size up
to which `macspec tune` fine-tunes a draft fully when told neither --full nor --lora-rank.

    python scripts/figures/tune_method_figures.py                    # every size, 4-bit drafts
    python scripts/figures/tune_method_figures.py --sizes 0,1 --bits 0 --steps 6

Each draft is a random mlx-lm llama (the tests' shape family), trained through macspec's own
`prepare` and `fine_tune` (mlx-lm's loss and batches) on random conversations of 8 x 128 tokens. It
prints the seconds per step (median over the steps after the first) and MLX's peak memory of
each method, and their ratios. Both are costs only: what the steps achieve is tune's own
before/after measurement (tests/test_tune.py).
"""

from __future__ import annotations

import argparse
import statistics

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import llama

from macspec.tune.answers import Example
from macspec.tune.loop import Step, fine_tune
from macspec.tune.train import TrainSettings, prepare, trainable_parameters

SIZES = [  # hidden, layers, intermediate, vocab
    (32, 1, 64, 260),  # the tests' weak draft
    (128, 2, 384, 2048),  # the demo's draft
    (256, 4, 768, 8192),
    (512, 6, 1536, 16384),
    (768, 8, 2048, 32768),
    (1024, 12, 2816, 32768),
    (896, 24, 4864, 32768),  # Qwen2.5-0.5B's blocks, a smaller vocabulary
    (640, 8, 1792, 16384),
]


class _Timer:
    """Each step's seconds, from the loop's step events."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.last = 0.0

    def __call__(self, event) -> None:
        if isinstance(event, Step):
            self.times.append(event.elapsed_s - self.last)
            self.last = event.elapsed_s


def build(size: tuple[int, int, int, int], bits: int) -> tuple[nn.Module, int]:
    hidden, layers, intermediate, vocab = size
    args = llama.ModelArgs(
        model_type="llama",
        hidden_size=hidden,
        num_hidden_layers=layers,
        intermediate_size=intermediate,
        num_attention_heads=max(1, hidden // 64),
        num_key_value_heads=max(1, hidden // 128),
        rms_norm_eps=1e-5,
        vocab_size=vocab,
        rope_theta=10000.0,
        tie_word_embeddings=False,
    )
    mx.random.seed(0)
    model = llama.Model(args)
    parameters = sum(v.size for _, v in nn.utils.tree_flatten(model.parameters()))
    if bits:
        nn.quantize(model, group_size=64 if hidden % 64 == 0 else 32, bits=bits)
    mx.eval(model.parameters())
    return model, parameters


def cost(size, bits: int, lora_rank: int | None, steps: int, seq: int) -> tuple[float, int, int]:
    """(seconds per step, peak bytes, trainable parameters) of `steps` steps of batch 8."""
    model, _ = build(size, bits)
    vocab = size[3]
    mx.random.seed(1)
    rows = mx.random.randint(0, vocab, (16, seq)).tolist()
    examples = [Example(tokens=row, offset=seq // 4) for row in rows]
    # Checks of the held-out loss only before the first step and after the last.
    settings = TrainSettings(
        max_steps=steps, eval_every=steps + 1, batch_size=8, lora_rank=lora_rank
    )
    mx.clear_cache()
    mx.reset_peak_memory()
    prepare(model, settings)
    timer = _Timer()
    fine_tune(model, examples, examples[:8], settings, timer)
    per_step = statistics.median(timer.times[1:] or timer.times)
    return per_step, mx.get_peak_memory(), trainable_parameters(model)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(str(i) for i in range(len(SIZES))))
    parser.add_argument("--bits", type=int, default=4, help="quantize the drafts (0: float32)")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128, help="tokens per conversation")
    args = parser.parse_args()
    print(
        f"{'parameters':>11} {'bits':>4} | {'full s/step':>11} {'LoRA s/step':>11} {'ratio':>5} "
        f"| {'full MB':>8} {'LoRA MB':>8} {'ratio':>5}"
    )
    for i in (int(s) for s in args.sizes.split(",")):
        _, parameters = build(SIZES[i], 0)
        full = cost(SIZES[i], args.bits, None, args.steps, args.seq)
        lora = cost(SIZES[i], args.bits, 8, args.steps, args.seq)
        print(
            f"{parameters / 1e6:>10.2f}M {args.bits or 32:>4} | {full[0]:>11.3f} {lora[0]:>11.3f} "
            f"{full[0] / lora[0]:>5.2f} | {full[1] / 1e6:>8.1f} {lora[1] / 1e6:>8.1f} "
            f"{full[1] / lora[1]:>5.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
