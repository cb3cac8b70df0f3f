"""Tiny random mlx-lm llama models and a byte-level tokenizer, built in memory for tests."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from dflashkit import dflash_config, save_dflash_folder  # noqa: F401 - tiny.* for every fixture
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


def llama_config(model: nn.Module) -> dict:
    """The config.json fields of a tiny llama built by `random_model`."""
    args = model.args
    return {
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
    }


def save_model(
    model: nn.Module,
    folder: Path,
    quantization: dict | None = None,
    tokenizer_shift: int = 0,
    chat_template: bool = True,
) -> Path:
    """Write an mlx-lm folder (config.json, model.safetensors, tokenizer files)."""
    folder.mkdir(parents=True, exist_ok=True)
    config = {**llama_config(model), "eos_token_id": 257, "bos_token_id": 256}
    if quantization:
        config["quantization"] = quantization
    (folder / "config.json").write_text(json.dumps(config))
    mx.save_safetensors(str(folder / "model.safetensors"), dict(tree_flatten(model.parameters())))
    write_tokenizer(folder, chat_template=chat_template, shift=tokenizer_shift)
    return folder


def tokenizer(folder: Path):
    """mlx-lm's TokenizerWrapper for a folder written by save_model or write_tokenizer."""
    return load_tokenizer(folder, eos_token_ids=[257])


# -- other architectures: the caches of 2026 (recurrent, hybrid, sliding window) --------------

ARCHITECTURES: dict[str, dict] = {
    # Qwen3: dense, full attention.
    "qwen3": dict(
        model_type="qwen3",
        hidden_size=64,
        num_hidden_layers=4,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rms_norm_eps=1e-6,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        rope_theta=10000.0,
    ),
    # Qwen3.5: Gated DeltaNet layers (ArraysCache) between full-attention layers (KVCache).
    "qwen3_5": dict(
        model_type="qwen3_5",
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        full_attention_interval=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        linear_num_value_heads=4,
        linear_num_key_heads=2,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        rms_norm_eps=1e-6,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        rope_parameters=dict(
            type="default", rope_theta=10000.0, partial_rotary_factor=0.25, mrope_section=[1, 1, 0]
        ),
    ),
    # Gemma 3: sliding-window layers (RotatingKVCache) with a global layer every other one.
    "gemma3_text": dict(
        model_type="gemma3_text",
        hidden_size=64,
        num_hidden_layers=4,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rms_norm_eps=1e-6,
        sliding_window=12,
        sliding_window_pattern=2,
        query_pre_attn_scalar=16,
        max_position_embeddings=4096,
    ),
    # Mamba 2: recurrent state only (ArraysCache), no attention at all.
    "mamba2": dict(
        model_type="mamba2",
        num_heads=8,  # x head_dim = hidden_size x expand (2), as transformers checks
        head_dim=16,
        hidden_size=64,
        intermediate_size=128,
        state_size=16,
        num_hidden_layers=2,
        layer_norm_epsilon=1e-5,
        conv_kernel=4,
        n_groups=1,
        use_bias=False,
        use_conv_bias=True,
        tie_word_embeddings=True,
        time_step_limit=(0.0, float("inf")),
        time_step_rank="auto",
    ),
    # LFM2: short convolutions (ArraysCache) and attention.
    "lfm2": dict(
        model_type="lfm2",
        hidden_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        norm_eps=1e-5,
        conv_bias=False,
        conv_L_cache=3,
        block_dim=64,
        block_multiple_of=16,
        block_ffn_dim_multiplier=1.0,
        block_auto_adjust_ff_dim=True,
        block_ff_dim=128,
        layer_types=["conv", "full_attention", "conv", "full_attention"],
    ),
}
# gpt-oss: MoE, alternating sliding-window (RotatingKVCache) and full-attention layers.
ARCHITECTURES["gpt_oss"] = dict(
    model_type="gpt_oss",
    num_hidden_layers=4,
    num_local_experts=4,
    num_experts_per_tok=2,
    hidden_size=64,
    intermediate_size=64,
    head_dim=16,
    num_attention_heads=4,
    num_key_value_heads=2,
    sliding_window=8,
    rope_theta=10000,
)
MOE = dict(num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1, norm_topk_prob=True)
"""Four experts, two per token, in every layer: what the tiny MoE models share."""
ARCHITECTURES["qwen3_5_moe"] = dict(
    ARCHITECTURES["qwen3_5"],
    **MOE,
    model_type="qwen3_5_moe",
    moe_intermediate_size=32,
    shared_expert_intermediate_size=32,
)
ARCHITECTURES["qwen3_moe"] = dict(
    ARCHITECTURES["qwen3"],
    **MOE,
    model_type="qwen3_moe",
    num_hidden_layers=2,
    moe_intermediate_size=64,
    mlp_only_layers=[],
)


CONFIGS: dict[int, dict] = {}
"""config.json of each model `arch_model` built, by id (a Module is a dict: no attributes)."""


def arch_config(kind: str, vocab: int = VOCAB, **overrides) -> dict:
    """The config.json of a tiny model of an mlx-lm architecture."""
    return {**ARCHITECTURES[kind], "vocab_size": vocab, **overrides}


def arch_model(kind: str, seed: int, scale: float = 1.0, **overrides) -> nn.Module:
    """A tiny random model of `kind`, built by mlx-lm's own classes as `mlx_lm.load` does."""
    from mlx_lm.utils import _get_classes

    config = arch_config(kind, **overrides)
    model_class, args_class = _get_classes(config)
    mx.random.seed(seed)
    model = model_class(args_class.from_dict(config))
    model.update(tree_map(lambda w: w * scale if w.ndim == 2 else w, model.parameters()))
    mx.eval(model.parameters())
    CONFIGS[id(model)] = config
    return model


def noisy_arch_copy(model: nn.Module, noise: float, seed: int) -> nn.Module:
    """`noisy_copy` for a model built by `arch_model`: same architecture, weights + noise."""
    from mlx_lm.utils import _get_classes

    config = CONFIGS[id(model)]
    model_class, args_class = _get_classes(config)
    copy = model_class(args_class.from_dict(config))
    mx.random.seed(seed)
    copy.update(
        tree_map(lambda w: w + noise * mx.random.normal(w.shape) * w.std(), model.parameters())
    )
    mx.eval(copy.parameters())
    CONFIGS[id(copy)] = config
    return copy


def save_arch_model(model: nn.Module, folder: Path) -> Path:
    """Write an mlx-lm folder for a model built by `arch_model` (loads with `mlx_lm.load`)."""
    folder.mkdir(parents=True, exist_ok=True)
    config = {**CONFIGS[id(model)], "eos_token_id": 257, "bos_token_id": 256}
    (folder / "config.json").write_text(json.dumps(config))
    mx.save_safetensors(str(folder / "model.safetensors"), dict(tree_flatten(model.parameters())))
    write_tokenizer(folder)
    return folder


def unrelated_llama(model: nn.Module, seed: int = 7) -> nn.Module:
    """An attention-only llama draft for any tiny target (same vocabulary, unrelated weights)."""
    return random_model(seed, scale=3.0)


# -- drafters that read the target: MTP heads and DFlash drafters --------------------------------


def near_bigram(model: nn.Module, mix: float = 0.05) -> nn.Module:
    """Scale every layer's output projections down: the model's next token then depends mostly
    on the current one, which an MTP head that reads the embedding can predict."""
    from mlx.utils import tree_unflatten

    outs = ("o_proj.weight", "down_proj.weight", "out_proj.weight")
    scaled = [(k, v * mix) for k, v in tree_flatten(model.parameters()) if k.endswith(outs)]
    model.update(tree_unflatten(scaled))
    mx.eval(model.parameters())
    return model


def mtp_weights(target: nn.Module, noise: float, seed: int = 5, reads_hidden: float = 0.0) -> dict:
    """An MTP head (mlx-vlm names) that predicts what a near-bigram target predicts next:
    it passes the embedding half through and adds nothing in its layer, then the target's own
    final norm; `noise` makes it wrong now and then. Built with mlx-lm's own classes."""
    from mlx.utils import tree_flatten as flat

    from macspec.engine.drafters.mtp import MTPHead

    config = CONFIGS[id(target)]
    head = MTPHead(config)
    mx.random.seed(seed)
    weights = dict(flat(head.parameters()))
    hidden = config["hidden_size"]
    hidden_half = reads_hidden * mx.random.normal((hidden, hidden)) / hidden**0.5
    weights["fc.weight"] = mx.concatenate([mx.eye(hidden), hidden_half], axis=1)
    for key in weights:
        if key.endswith(("o_proj.weight", "down_proj.weight")):
            weights[key] = mx.zeros_like(weights[key])
    inner = target.language_model.model if hasattr(target, "language_model") else target.model
    weights["norm.weight"] = inner.norm.weight
    for key, value in weights.items():
        if value.ndim == 2 and noise:
            weights[key] = value + noise * mx.random.normal(value.shape)
    return weights


def save_mtp_folder(
    target: nn.Module,
    folder: Path,
    noise: float = 0.02,
    bits: int | None = None,
    reads_hidden: float = 0.0,
) -> Path:
    """A drafter folder in mlx-vlm's qwen3_5_mtp format for a tiny qwen3_5 target."""
    from macspec.engine.drafters.mtp import MTPHead

    folder.mkdir(parents=True, exist_ok=True)
    config = CONFIGS[id(target)]
    head = MTPHead(config)
    head.load_weights(list(mtp_weights(target, noise, reads_hidden=reads_hidden).items()))
    head_config = {"model_type": "qwen3_5_mtp", "text_config": config, "block_size": 3}
    if bits:
        nn.quantize(head, group_size=32, bits=bits)
        head_config["quantization"] = {"group_size": 32, "bits": bits}
    mx.eval(head.parameters())
    (folder / "config.json").write_text(json.dumps(head_config))
    mx.save_safetensors(str(folder / "model.safetensors"), dict(tree_flatten(head.parameters())))
    return folder
