"""A GGUF's metadata as an mlx-lm config.json, and its tensors under mlx-lm's names: the entry
points the loader uses, each asking the file's architecture (`archs/`, one module each) what
is its own."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from gguf import GGMLQuantizationType

from macspec.errors import MacspecError
from macspec.models.gguf.archs import ARCHITECTURES, architecture_of
from macspec.models.gguf.header import GGUFHeader

MODEL_TYPES = {name: arch.model_type for name, arch in ARCHITECTURES.items()}
"""GGUF architectures macspec reads, and the mlx-lm model each becomes."""


def check_architecture(header: GGUFHeader) -> str:
    """The mlx-lm model for the file's architecture, or one line naming the one it is not."""
    return architecture_of(header).model_type


def mlx_name(name: str, arch: str) -> str:
    """`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`."""
    if arch not in ARCHITECTURES:
        raise MacspecError(f"a tensor macspec does not know in a {arch} file: {name}")
    return ARCHITECTURES[arch].mlx_name(name)


def build_config(header: GGUFHeader) -> dict[str, Any]:
    """config.json for mlx-lm's model class of this architecture."""
    return architecture_of(header).config(header)


def quantization(header: GGUFHeader, weights: dict[str, mx.array]) -> dict[str, Any]:
    """mlx-lm's `quantization` entry: each quantized module's bits and group size (embeddings
    and layers may differ; a converter may choose either), told by the converted arrays'
    widths against the tensor's own (MXFP4's mode too: mlx-lm passes each module's entry to its
    `to_quantized`, gpt_oss's stacked experts' included)."""
    arch = architecture_of(header)
    modules = {
        name: arch.mlx_modules(name)
        for name in header.tensors
        if not arch.is_config(name) and not arch.is_unused(name, header)
    }
    return quantized_modules(header, weights, modules)


def quantized_modules(
    header: GGUFHeader, weights: dict[str, mx.array], modules: dict[str, list[str]]
) -> dict[str, Any]:
    """`quantization`'s entry for the tensors `modules` maps (GGUF name -> the MLX modules it
    is the weight of)."""
    per_module: dict[str, Any] = {}
    for name, targets in modules.items():
        tensor = header.tensors[name]
        scales = weights.get(f"{name.removesuffix('.weight')}.scales")
        if scales is None:
            continue
        width = tensor.shape[-1]
        entry: dict[str, Any] = {
            "group_size": width // scales.shape[-1],
            "bits": weights[name].shape[-1] * 32 // width,  # uint32 words hold 32 bits each
        }
        if tensor.qtype == GGMLQuantizationType.MXFP4:  # kquants keeps it MLX's own mxfp4
            entry["mode"] = "mxfp4"
        for module in targets:
            per_module[module] = dict(entry)
    if not per_module:
        return {}
    first = next(iter(per_module.values()))
    return {"quantization": {**first, **per_module}}


def to_mlx(header: GGUFHeader, config: dict[str, Any], weights: dict[str, mx.array]) -> dict:
    """GGUF tensors (by GGUF name) as mlx-lm's weights for `config`'s model."""
    arch = architecture_of(header)
    return {
        mlx_name: value
        for name, tensor in arch.fused(weights).items()
        if not arch.is_config(name) and not arch.is_unused(name, header)
        for mlx_name, value in arch.mlx_tensors(name, tensor, config)
    }


def rope_factors(header: GGUFHeader, weights: dict[str, mx.array]) -> mx.array | None:
    """Llama 3.1's per-frequency rope factors, or None."""
    return architecture_of(header).rope_factors(weights)
