"""A GGUF's metadata as an mlx-lm config.json, and its tensors under mlx-lm's names.

llama.cpp's conventions, undone here (convert_hf_to_gguf.py): llama files permute the Q and K
rows of each head for interleaved rope (put back, so mlx-lm's usual rope reads them); Gemma
files store every RMSNorm weight with 1 added (mlx-lm's Gemma adds it itself); a file without
`output.weight` ties its embeddings; Llama 3.1's rope scaling is a `rope_freqs` tensor of
per-frequency factors (set on the rope after the model is built).
"""

from __future__ import annotations

import re
from typing import Any

import mlx.core as mx
import numpy as np

from macspec.errors import MacspecError
from macspec.models.gguf.header import GGUFHeader

MODEL_TYPES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3_text"}
"""GGUF architectures macspec reads, and the mlx-lm model each becomes."""

GEMMA3_SLIDING_PATTERN = 6
"""Every 6th Gemma 3 layer attends globally (llama.cpp fixes it too; no GGUF key says it)."""
GEMMA3_LOCAL_ROPE_BASE = 10_000.0

_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_norm": "input_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_norm": "post_attention_layernorm",
}
_GEMMA_LAYER_NAMES = {
    **_LAYER_NAMES,
    "ffn_norm": "pre_feedforward_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_LAYER = re.compile(r"blk\.(\d+)\.([a-z_0-9]+)\.(weight|bias|scales|biases)")
_TOP = re.compile(r"([a-z_0-9]+)\.(weight|bias|scales|biases)")
ROPE_FREQS = "rope_freqs.weight"
"""Configuration stored as a tensor (Llama 3.1's rope factors), not a weight."""


def check_architecture(header: GGUFHeader) -> str:
    """The mlx-lm model for the file's architecture, or one line naming the one it is not."""
    arch = header.architecture
    if arch not in MODEL_TYPES:
        raise MacspecError(
            f"{header.path}: architecture '{arch}' is not supported for GGUF files "
            f"(supported: {', '.join(MODEL_TYPES)})"
        )
    return MODEL_TYPES[arch]


def mlx_name(name: str, arch: str) -> str:
    """`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`."""
    layer_names = _GEMMA_LAYER_NAMES if arch == "gemma3" else _LAYER_NAMES
    match = _LAYER.fullmatch(name)
    if match and match.group(2) in layer_names:
        index, part, kind = match.groups()
        return f"model.layers.{index}.{layer_names[part]}.{kind}"
    match = _TOP.fullmatch(name)
    if match and match.group(1) in _TOP_NAMES:
        return f"{_TOP_NAMES[match.group(1)]}.{match.group(2)}"
    raise MacspecError(f"a tensor macspec does not know in a {arch} file: {name}")


def build_config(header: GGUFHeader) -> dict[str, Any]:
    """config.json for mlx-lm's model class of this architecture."""
    kind = check_architecture(header)
    arch, meta = header.architecture, header.metadata

    def key(name: str, default: Any = None) -> Any:
        value = meta.get(f"{arch}.{name}", default)
        if value is None:
            raise MacspecError(f"{header.path}: no {arch}.{name} in the metadata")
        return value

    embed = header.tensors.get("token_embd.weight")
    if embed is None:
        raise MacspecError(f"{header.path}: no token_embd.weight (not a language model?)")
    heads, hidden = int(key("attention.head_count")), int(key("embedding_length"))
    config: dict[str, Any] = {
        "model_type": kind,
        "hidden_size": hidden,
        "num_hidden_layers": int(key("block_count")),
        "intermediate_size": int(key("feed_forward_length")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(key("attention.head_count_kv", heads)),
        "head_dim": int(key("attention.key_length", hidden // heads)),
        "rms_norm_eps": float(key("attention.layer_norm_rms_epsilon", 1e-6)),
        "vocab_size": int(embed.shape[0]),
        "max_position_embeddings": int(key("context_length", 4096)),
        "rope_theta": float(key("rope.freq_base", 10_000.0)),
        "tie_word_embeddings": "output.weight" not in header.tensors,
    }
    scaling = meta.get(f"{arch}.rope.scaling.type")
    if scaling == "linear":
        config["rope_scaling"] = {"type": "linear", "factor": float(key("rope.scaling.factor"))}
    elif scaling not in (None, "none"):
        raise MacspecError(f"{header.path}: rope scaling '{scaling}' is not supported yet")
    if arch == "llama":
        config["attention_bias"] = "blk.0.attn_q.bias" in header.tensors
        if ROPE_FREQS in header.tensors:
            # Llama 3.1: a Llama3RoPE whose frequencies are then set from the file's factors.
            # (The values are transformers' defaults: it checks them when reading the config.)
            config["rope_scaling"] = {
                "rope_type": "llama3",
                "factor": float(meta.get(f"{arch}.rope.scaling.factor", 8.0)),
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": int(
                    meta.get(f"{arch}.rope.scaling.original_context_length", 8192)
                ),
            }
    if arch == "gemma3":
        config["sliding_window"] = int(key("attention.sliding_window", 512))
        config["sliding_window_pattern"] = GEMMA3_SLIDING_PATTERN
        config["rope_local_base_freq"] = GEMMA3_LOCAL_ROPE_BASE
        # llama.cpp: Gemma 3 27B scales queries by hidden/heads, the others by the head size.
        big = config["num_hidden_layers"] == 62
        config["query_pre_attn_scalar"] = hidden // heads if big else config["head_dim"]
    return config


def quantization(header: GGUFHeader, weights: dict[str, mx.array]) -> dict[str, Any]:
    """mlx-lm's `quantization` entry: each quantized module's bits and group size (embeddings
    and layers may differ; a converter may choose either), told by the converted arrays'
    widths against the tensor's own."""
    per_module: dict[str, Any] = {}
    for name, tensor in header.tensors.items():
        stem = name.removesuffix(".weight")
        scales = weights.get(f"{stem}.scales")
        if scales is None or name == ROPE_FREQS:
            continue
        width = tensor.shape[-1]
        module = mlx_name(name, header.architecture).removesuffix(".weight")
        per_module[module] = {
            "group_size": width // scales.shape[-1],
            "bits": weights[name].shape[-1] * 32 // width,  # uint32 words hold 32 bits each
        }
    if not per_module:
        return {}
    first = next(iter(per_module.values()))
    return {"quantization": {**first, **per_module}}


def _unpermute_rows(rows: int, heads: int) -> mx.array:
    """The row order that undoes llama.cpp's `permute` of a Q or K projection."""
    order = np.arange(rows).reshape(heads, 2, rows // heads // 2).swapaxes(1, 2).reshape(-1)
    return mx.array(np.argsort(order))


def to_mlx(header: GGUFHeader, config: dict[str, Any], weights: dict[str, mx.array]) -> dict:
    """GGUF tensors (by GGUF name) as mlx-lm's weights for `config`'s model."""
    arch = header.architecture
    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    orders: dict[tuple[int, int], mx.array] = {}
    out = {}
    for name, value in weights.items():
        if name == ROPE_FREQS:
            continue
        part = name.split(".")[2] if name.startswith("blk.") else ""
        if arch == "llama" and part in heads:
            shape = (value.shape[0], heads[part])
            if shape not in orders:
                orders[shape] = _unpermute_rows(*shape)
            value = mx.take(value, orders[shape], axis=0)
        elif arch == "gemma3" and name.endswith("norm.weight"):
            value = value - 1  # the converter added Gemma's (1 + w) offset
        out[mlx_name(name, arch)] = value
    return out


def rope_factors(header: GGUFHeader, weights: dict[str, mx.array]) -> mx.array | None:
    """Llama 3.1's per-frequency rope factors, or None."""
    return weights.get(ROPE_FREQS) if header.architecture == "llama" else None
