"""Ollama's MLX models written the way its x/create writes them: one `image.tensor` layer per
tensor (named by its Hugging Face name), each blob a safetensors file holding the tensor and,
quantized, `X.weight` (packed) with `X.weight.scale` and `X.weight.bias` (affine), the blob's
`__metadata__` naming `quant_type` and `group_size` (per tensor in a mixed blob); stacked
experts `...mlp.experts.<proj>.weight` [E, out, in]; `image.json` layers for config.json and
the tokenizer's files; a draft's tensors under `draft.` with a `draft/config.json` layer
(x/create/quantize.go, quantpolicy.go, create.go's GetTensorQuantization, pipeline.go, draft.go).

Beside each store model, the same arrays as an mlx-lm folder: the reference it must equal."""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from storekit import LAYER, OllamaStore
from tiny import write_tokenizer

from macspec.models.stores.ollama_mlx import QUANT_TYPES as QUANT

EIGHT_BIT = {"int4": "int8", "int8": "int8", "mxfp4": "mxfp8", "nvfp4": "mxfp8", "mxfp8": "mxfp8"}
"""quantpolicy.go's eightBit: the 8-bit type of each family (sensitive tensors are promoted)."""


def quant_type(name: str, shape: tuple[int, ...], base: str | None) -> str | None:
    """x/create's GetTensorQuantization for what a tiny model holds: norms, embeddings and the
    router unquantized; lm_head 8-bit; k/v/down projections 8-bit under int4 (and fp4 outside
    stacked experts)."""
    stacked = len(shape) == 3
    if base is None or len(shape) < 2 or math.prod(shape) < 1024:
        return None
    if "embed_tokens" in name or name.endswith(".mlp.gate.weight"):
        return None
    if name.endswith("lm_head.weight"):
        return EIGHT_BIT[base]
    sensitive = any(part in name for part in (".v_proj", ".k_proj", "down_proj"))
    if sensitive and (base == "int4" or (base in ("mxfp4", "nvfp4") and not stacked)):
        return EIGHT_BIT[base]
    return base


def ollama_name(name: str) -> str:
    """An mlx-lm parameter's Hugging Face name as Ollama stores it (stacked experts)."""
    return name.replace(".switch_mlp.", ".experts.")


def blob_bytes(arrays: dict[str, mx.array], metadata: dict[str, str]) -> bytes:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "blob.safetensors"
        mx.save_safetensors(str(path), arrays, metadata=metadata)
        return path.read_bytes()


def tensor_layer(store: OllamaStore, name: str, arrays: dict, metadata: dict) -> dict:
    return {"mediaType": LAYER + "tensor", **store.blob(blob_bytes(arrays, metadata)), "name": name}


def json_layer(store: OllamaStore, name: str, data: bytes) -> dict:
    return {"mediaType": LAYER + "json", **store.blob(data), "name": name}


def quantized_arrays(
    name: str, weight: mx.array, kind: str, global_scale: bool = False
) -> dict[str, mx.array]:
    """x/create/quantize.go's arrays for one tensor: weight, `.scale`, `.bias` (affine); with
    `global_scale` (nvfp4), ModelOpt's double scale as x/create/prequant.go stores it: the
    weight over `.global_scale` (F32, amax / (6 * 448), the dequantizing multiplier) packed."""
    group, bits, mode = QUANT[kind]
    scale = None
    if global_scale and kind == "nvfp4":
        scale = (mx.max(mx.abs(weight)) / (6 * 448)).astype(mx.float32)
        weight = weight / scale
    parts = mx.quantize(weight, group_size=group, bits=bits, mode=mode)
    arrays = {name: parts[0], f"{name}.scale": parts[1]}
    if scale is not None:
        arrays[f"{name}.global_scale"] = scale
    if len(parts) > 2 and parts[2] is not None:
        arrays[f"{name}.bias"] = parts[2]
    return arrays


def dequantized(arrays: dict[str, mx.array], name: str) -> mx.array:
    """An nvfp4 tensor with a global scale as the float weight it stands for."""
    group, bits, mode = QUANT["nvfp4"]
    weight = mx.dequantize(
        arrays[name], arrays[f"{name}.scale"], group_size=group, bits=bits, mode=mode
    )
    return weight * arrays[f"{name}.global_scale"]


class Written:
    """A model written to the store and as an mlx-lm folder."""

    def __init__(self, manifest: Path, reference: Path):
        self.manifest, self.reference = manifest, reference


def write_model(
    store: OllamaStore,
    model_name: str,
    model: nn.Module,
    config: dict,
    base: str | None,
    reference: Path,
    per_expert: bool = False,
    draft: tuple[nn.Module, dict] | None = None,
    global_scales: bool = False,
    as_stored: Callable[[str, mx.array], mx.array] | None = None,
    extra: dict[str, mx.array] | None = None,
) -> Written:
    """`model` as `ollama create --quantize base` stores it (one blob per tensor; a layer's
    experts together in one mixed blob), and the same arrays as the mlx-lm folder `reference`
    (with `global_scales`, ModelOpt's nvfp4: its tensors dequantized, the reference a float
    model). `as_stored`: an unquantized tensor as the store keeps it (Hugging Face's layout),
    by its name; `extra`: tensors the store holds beside the model's (a target's `mtp.*`)."""
    config = {**config, "eos_token_id": 257, "bos_token_id": 256}
    layers: list[dict] = []
    ref_weights: dict[str, mx.array] = {}
    ref_quant: dict[str, dict] = {}
    experts: dict[str, tuple[dict, dict]] = {}  # a layer's experts: one blob (arrays, metadata)
    for key, weight in tree_flatten(model.parameters()):
        name = ollama_name(key)
        kind = quant_type(name, weight.shape, base)
        arrays = quantized_arrays(name, weight, kind, global_scales) if kind else {name: weight}
        if f"{name}.global_scale" in arrays:
            ref_weights[key] = dequantized(arrays, name)  # the reference: a float weight
        else:
            _add_reference(key, name, arrays, kind, ref_weights, ref_quant)
        if as_stored is not None and kind is None:
            arrays = {name: as_stored(name, weight)}
        metadata = blob_metadata(kind)
        if ".mlp.experts." in name and per_expert:
            layers += _per_expert_layers(store, name, weight, kind)
        elif ".mlp.experts." in name:
            prefix = name.split(".mlp.experts.")[0]
            blob_arrays, blob_meta = experts.setdefault(prefix, ({}, {}))
            blob_arrays.update(arrays)
            blob_meta.update({f"{name}.{k}": v for k, v in metadata.items()})
        else:
            layers.append(tensor_layer(store, name, arrays, metadata))
    for prefix, (arrays, metadata) in experts.items():
        layers.append(tensor_layer(store, f"{prefix}.mlp.experts", arrays, metadata))
    for name, weight in (extra or {}).items():
        kind = quant_type(name, weight.shape, base)
        arrays = quantized_arrays(name, weight, kind) if kind else {name: weight}
        layers.append(tensor_layer(store, name, arrays, blob_metadata(kind)))
    if draft is not None:
        layers += draft_layers(store, *draft, base)
    layers += tokenizer_layers(store, config)
    manifest = store.add(
        model_name,
        template=None,
        extra=layers,
        config={"model_format": "safetensors", "file_type": base},
    )
    _write_reference(reference, config, ref_weights, ref_quant)
    return Written(manifest, reference)


def _add_reference(
    key: str, name: str, arrays: dict, kind: str | None, weights: dict, quant: dict
) -> None:
    """One tensor's arrays under mlx-lm's names, with its quantization, for the reference."""
    module = key.removesuffix(".weight")
    for array_name, array in arrays.items():
        suffix = array_name.removeprefix(name)
        ref_name = {"": key, ".scale": f"{module}.scales", ".bias": f"{module}.biases"}
        weights[ref_name[suffix]] = array
    if kind:
        group, bits, mode = QUANT[kind]
        quant[module] = {"group_size": group, "bits": bits, "mode": mode}


def _per_expert_layers(store: OllamaStore, name: str, weight: mx.array, kind: str | None):
    """An older store's experts: one tensor per expert index (`experts.3.gate_proj.weight`)."""
    head, proj = name.split(".mlp.experts.")
    layers = []
    for index in range(weight.shape[0]):
        one = f"{head}.mlp.experts.{index}.{proj}"
        arrays = quantized_arrays(one, weight[index], kind) if kind else {one: weight[index]}
        layers.append(tensor_layer(store, one, arrays, blob_metadata(kind)))
    return layers


def draft_layers(store: OllamaStore, draft: nn.Module, config: dict, base: str | None):
    """x/create/draft.go: the draft's tensors under `draft.` (quantized as the target's), its
    config as draft/config.json."""
    layers = []
    for key, weight in tree_flatten(draft.parameters()):
        name = f"draft.{key}"
        kind = quant_type(name, weight.shape, base)
        arrays = quantized_arrays(name, weight, kind) if kind else {name: weight}
        layers.append(tensor_layer(store, name, arrays, blob_metadata(kind)))
    layers.append(json_layer(store, "draft/config.json", json.dumps(config).encode()))
    return layers


def blob_metadata(kind: str | None) -> dict[str, str]:
    """A one-tensor blob's `__metadata__` (none when the tensor is kept unquantized)."""
    return {"quant_type": kind, "group_size": str(QUANT[kind][0])} if kind else {}


def tokenizer_layers(store: OllamaStore, config: dict) -> list[dict]:
    """config.json and the tokenizer's JSON files, as importConfigBlobs writes them."""
    layers = [json_layer(store, "config.json", json.dumps(config).encode())]
    with tempfile.TemporaryDirectory() as folder:
        write_tokenizer(Path(folder))
        for file in sorted(Path(folder).glob("*.json")):
            layers.append(json_layer(store, file.name, file.read_bytes()))
    return layers


def _write_reference(folder: Path, config: dict, weights: dict, quant: dict) -> None:
    """The same arrays as an mlx-lm folder: mlx-lm's names, its per-module `quantization`."""
    folder.mkdir(parents=True, exist_ok=True)
    if quant:
        first = next(iter(quant.values()))
        config = {**config, "quantization": {**first, **quant}}
    (folder / "config.json").write_text(json.dumps(config))
    mx.save_safetensors(str(folder / "model.safetensors"), weights)
    write_tokenizer(folder)
