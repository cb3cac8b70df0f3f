"""A folder `ollama_mlx.tensor_folder` derived, loaded as an mlx-lm model: mlx-lm's own classes
built from its config.json, quantized per module as its `quantization` says, the weights read
from Ollama's blobs where they lie (`mx.load` reads a safetensors file without its extension)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from macspec.errors import MacspecError
from macspec.models.quantized import quantize_as_saved
from macspec.models.stores.ollama_entry import mlx_name, tensor_entry

_ONE_EXPERT = re.compile(r"^(.*\.mlp\.experts)\.(\d+)\.(.+)$")
"""An expert's own tensor (older stores): `...mlp.experts.3.gate_proj.weight`."""


def read_blobs(blobs: list[str], folder: Path, prefix: str = "") -> dict[str, mx.array]:
    """Every tensor of the blobs, under mlx-lm's names (less `prefix`: a draft's `draft.`);
    experts stored one per index (older stores) stacked as mlx-lm's SwitchGLU holds them
    ([E, out, in], as newer stores do)."""
    weights: dict[str, mx.array] = {}
    experts: dict[str, dict[int, mx.array]] = {}
    for blob in blobs:
        if not Path(blob).is_file():
            raise MacspecError(f"{folder}: blob {blob} is gone from Ollama's store; pull it again")
        for name, array in mx.load(blob, format="safetensors").items():
            one = _ONE_EXPERT.match(name)
            if one is None:
                weights[mlx_name(name).removeprefix(prefix)] = array
            else:
                stacked = mlx_name(f"{one[1]}.{one[3]}")
                experts.setdefault(stacked, {})[int(one[2])] = array
    for name, by_index in experts.items():
        weights[name] = mx.stack([by_index[i] for i in sorted(by_index)])
    return weights


def load_tensor_model(folder: Path) -> nn.Module:
    """The model of a derived Ollama MLX folder; one line when a blob went or does not fit."""
    from mlx_lm.utils import _get_classes, load_config

    entry = tensor_entry(folder)
    if entry is None:
        raise MacspecError(f"{folder}: not an Ollama MLX model folder")
    config = load_config(folder)
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    weights = read_blobs(entry["blobs"], folder)
    if hasattr(model, "sanitize"):
        weights = model.sanitize(weights)
    quantize_as_saved(model, config.get("quantization"), weights)
    model.eval()
    try:
        model.load_weights(list(weights.items()), strict=True)
    except ValueError as exc:
        reason = " ".join(str(exc).split())
        reason = reason if len(reason) < 300 else reason[:300] + "..."  # mlx names them all
        raise MacspecError(
            f"{entry['manifest']}: its tensors do not fit its config ({reason})"
        ) from None
    mx.eval(model.parameters())
    try:  # the folder's time is when it was last used
        os.utime(folder)
    except OSError:
        pass
    return model
