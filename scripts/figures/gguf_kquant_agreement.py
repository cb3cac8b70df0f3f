"""Gemma 3 270M Q4_K_M on mlx-lm: greedy agreement with the float32 reference and the KL of the
next-token distributions, for the exact K-quant conversion against plain MLX requantization.

Dev tool (the figures of issue 52's closing note):

    PYTHONPATH=$PWD python scripts/figures/gguf_kquant_agreement.py
    PYTHONPATH=$PWD python scripts/figures/gguf_kquant_agreement.py --tokens 32 --prompts 10

Each variant is mlx-lm's own gemma3_text model of the file (config and tokenizer as macspec
derives them; the tokenizer encodes as the published one, tests/test_gguf_gemma3.py):
  float32     every tensor dequantized by gguf to float32: the reference
  exact       macspec's loader: Q4_K, Q5_0, Q8_0 as MLX affine weights, bit for bit; Q6_K (no
              exact form) as float16
  exact+q6k8  the same with Q6_K requantized to 8-bit g32
  f16-scales  exact, with the scales and biases rounded to float16 (d*sc rounded; computed in
              float32 as the others, so only that rounding shows)
  mlx-4g32    the float32 model requantized by MLX: every Linear and the embedding, 4-bit g32
  mlx-4g64    the same with groups of 64
Greedy: the continuation of each raw prompt (BOS + text) through mlx-lm's generate_step; the
count is how many leading tokens equal the reference's. KL(reference || variant) is over the
positions of the reference's continuation, teacher-forced, in nats.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.generate import generate_step
from mlx_lm.tokenizer_utils import load as load_tokenizer

from macspec.models import hub
from macspec.models.gguf import layout
from macspec.models.gguf.load import CONVERTED, load_gguf_model

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from kquantkit import float32_reference, gemma_q4_k_m  # noqa: E402

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village by the sea,",
    "The three primary colors are",
    "Photosynthesis is the process by which",
    "1, 1, 2, 3, 5, 8, 13,",
    "La tour Eiffel a été construite en",
    "To install the package, run the following command:\n",
    "The mitochondria is",
    "import numpy as np\n\nx = np.",
    "In 1969, Neil Armstrong",
    "Water boils at",
]


def converted(folder: Path, kind: str, requantize: tuple[int, int] | None = None) -> nn.Module:
    """macspec's loader in layout `kind`, requantizing as `requantize` (bits, group) says; the
    converted copy of an earlier variant removed first."""
    for name in CONVERTED.values():
        (folder / name).unlink(missing_ok=True)
    original = layout.REQUANTIZED_DEFAULT
    layout.REQUANTIZED_DEFAULT = requantize or original
    try:
        return load_gguf_model(folder, layout.Layout(kind))
    finally:
        layout.REQUANTIZED_DEFAULT = original


def requantized(model: nn.Module, group_size: int) -> nn.Module:
    """MLX's plain 4-bit requantization of the float model (Linear layers and the embedding)."""
    nn.quantize(model, group_size=group_size, bits=4)
    mx.eval(model.parameters())
    return model


def greedy(model: nn.Module, prompt: list[int], tokens: int) -> list[int]:
    steps = generate_step(mx.array(prompt), model, max_tokens=tokens)
    return [int(token) for token, _ in steps]


def log_probs(model: nn.Module, ids: list[int], count: int) -> mx.array:
    """Teacher-forced next-token log-probabilities at the last `count` predicting positions."""
    logits = model(mx.array(ids)[None])[0, -count - 1 : -1].astype(mx.float32)
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", type=Path, help="default: Gemma 3 270M Q4_K_M's parts")
    parser.add_argument("--prompts", type=int, default=10)
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument(
        "--requantize",
        type=lambda text: tuple(int(n) for n in text.split("g")),
        nargs="+",
        default=[(8, 32), (8, 64), (6, 32), (6, 64)],
        metavar="BgG",
        help="the compact layouts to measure: BITSgGROUP (default: 8g32 8g64 6g32 6g64)",
    )
    parser.add_argument("--mlx", action="store_true", help="also MLX's own 4-bit requantization")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        os.environ["MACSPEC_HOME"] = scratch  # the derived folder, thrown away after
        path = args.gguf or gemma_q4_k_m(Path(scratch))
        folder = hub.local_model_path(str(path))
        tokenizer = load_tokenizer(folder)
        prompts = [tokenizer.encode(text) for text in PROMPTS[: args.prompts]]  # BOS + text
        reference = functools.partial(float32_reference, folder, path)
        variants = {
            "float32": reference,
            "exact": lambda: converted(folder, "exact"),
            **{
                f"compact-{bits}g{group}": functools.partial(
                    converted, folder, "compact", (bits, group)
                )
                for bits, group in args.requantize
            },
        }
        if args.mlx:
            variants["mlx-4g32"] = lambda: requantized(reference(), 32)
            variants["mlx-4g64"] = lambda: requantized(reference(), 64)
        reference_ids, reference_lp = [], []
        print(
            "| variant | greedy tokens equal to float32's, per prompt | total | mean KL | max KL |"
        )
        print("| --- | --- | --- | --- | --- |")
        for name, make in variants.items():
            began = time.perf_counter()
            model = make()
            agree, kls = [], []
            for n, prompt in enumerate(prompts):
                ids = greedy(model, prompt, args.tokens)
                if name == "float32":
                    reference_ids.append(ids)
                    reference_lp.append(log_probs(model, prompt + ids, len(ids)))
                    mx.eval(reference_lp[-1])
                expected = reference_ids[n]
                same = next((i for i, (a, b) in enumerate(zip(ids, expected)) if a != b), None)
                agree.append(len(expected) if same is None else same)
                lp = log_probs(model, prompt + expected, len(expected))
                kl = (mx.exp(reference_lp[n]) * (reference_lp[n] - lp)).sum(axis=-1)
                kls.append(np.array(kl))
            kl_all = np.concatenate(kls)
            print(
                f"| {name} | {'/'.join(map(str, agree))} | {sum(agree)}/{args.tokens * len(agree)}"
                f" | {kl_all.mean():.2e} | {kl_all.max():.2e} |",
                flush=True,
            )
            print(f"  ({name}: {time.perf_counter() - began:.0f} s)", file=sys.stderr)
            del model
        for prompt, ids in zip(PROMPTS, reference_ids):
            print(f"{prompt!r} -> {tokenizer.decode(ids)!r}", file=sys.stderr)


if __name__ == "__main__":
    main()
