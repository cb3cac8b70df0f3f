"""Tiny random mlx-lm llama models and a byte-level tokenizer, built in memory for tests."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_map
from mlx_lm.models import llama
from mlx_lm.tokenizer_utils import load as load_tokenizer

SPECIALS = ["<|bos|>", "<|eos|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ '<|' + m['role'] + '|>' + m['content'] + '<|eos|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def write_tokenizer(folder: Path, chat_template: bool = True, shift: int = 0) -> int:
    """A byte-level tokenizer (256 bytes + specials); `shift` rotates ids to make a mismatch."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_chars = list(pre_tokenizers.ByteLevel.alphabet())
    byte_chars.sort()
    vocab = {ch: (i + shift) % 256 for i, ch in enumerate(byte_chars)}
    for j, special in enumerate(SPECIALS):
        vocab[special] = 256 + j
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|bos|>",
        eos_token="<|eos|>",
        additional_special_tokens=["<|user|>", "<|assistant|>"],
    )
    if chat_template:
        fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(folder))
    return len(vocab)


VOCAB = 256 + len(SPECIALS)


def model_args(
    vocab: int = VOCAB,
    hidden: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 128,
) -> llama.ModelArgs:
    return llama.ModelArgs(
        model_type="llama",
        hidden_size=hidden,
        num_hidden_layers=layers,
        intermediate_size=intermediate,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        rms_norm_eps=1e-5,
        vocab_size=vocab,
        rope_theta=10000.0,
        tie_word_embeddings=False,
    )


def random_model(seed: int, args: llama.ModelArgs | None = None, scale: float = 1.0) -> nn.Module:
    """Random weights; `scale` sharpens the output so greedy runs are not all ties."""
    mx.random.seed(seed)
    model = llama.Model(args or model_args())
    model.update(tree_map(lambda w: w * scale if w.ndim == 2 else w, model.parameters()))
    mx.eval(model.parameters())
    return model


def noisy_copy(model: nn.Module, noise: float, seed: int) -> nn.Module:
    """The same architecture and weights plus Gaussian noise: a draft that mostly agrees."""
    copy = llama.Model(model.args)
    mx.random.seed(seed)
    copy.update(
        tree_map(lambda w: w + noise * mx.random.normal(w.shape) * w.std(), model.parameters())
    )
    mx.eval(copy.parameters())
    return copy


def quantized(model: nn.Module, bits: int = 4, group_size: int = 32) -> nn.Module:
    copy = llama.Model(model.args)
    copy.update(model.parameters())
    nn.quantize(copy, group_size=group_size, bits=bits)
    mx.eval(copy.parameters())
    return copy


def save_model(
    model: nn.Module,
    folder: Path,
    quantization: dict | None = None,
    tokenizer_shift: int = 0,
    chat_template: bool = True,
) -> Path:
    """Write an mlx-lm folder (config.json, model.safetensors, tokenizer files)."""
    folder.mkdir(parents=True, exist_ok=True)
    args = model.args
    config = {
        "model_type": "llama",
        "hidden_size": args.hidden_size,
        "num_hidden_layers": args.num_hidden_layers,
        "intermediate_size": args.intermediate_size,
        "num_attention_heads": args.num_attention_heads,
        "num_key_value_heads": args.num_key_value_heads,
        "rms_norm_eps": args.rms_norm_eps,
        "vocab_size": args.vocab_size,
        "rope_theta": args.rope_theta,
        "tie_word_embeddings": args.tie_word_embeddings,
        "eos_token_id": 257,
        "bos_token_id": 256,
    }
    if quantization:
        config["quantization"] = quantization
    (folder / "config.json").write_text(json.dumps(config))
    mx.save_safetensors(str(folder / "model.safetensors"), dict(tree_flatten(model.parameters())))
    write_tokenizer(folder, chat_template=chat_template, shift=tokenizer_shift)
    return folder


def tokenizer(folder: Path):
    """mlx-lm's TokenizerWrapper for a folder written by save_model or write_tokenizer."""
    return load_tokenizer(folder, eos_token_ids=[257])
