"""Reading a drafter head's folder: its config, its safetensors weights, and the quantization
and loading mlx_lm.load would apply; shared by the MTP, DFlash and EAGLE-3 loaders."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from macspec.errors import MacspecError
from macspec.models.quantized import quantize_as_saved


def read_config(folder: Path) -> dict[str, Any]:
    """A model folder's config.json, as a dict."""
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise MacspecError(f"{folder}: cannot read config.json ({exc})") from None
    if not isinstance(config, dict):
        raise MacspecError(f"{folder}: config.json is not a JSON object")
    return config


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """A model config's language part (VLM checkpoints nest it under text_config)."""
    return config.get("text_config") or config


def read_weights(folder: Path) -> dict[str, mx.array]:
    """Every tensor of a folder's *.safetensors files (of a draft an Ollama manifest carries:
    its blobs in Ollama's store)."""
    from macspec.models.stores.ollama_entry import tensor_entry

    entry = tensor_entry(folder)
    if entry is not None:
        from macspec.models.stores.ollama_mlx_load import read_blobs

        return read_blobs(entry["blobs"], folder, entry.get("prefix", ""))
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise MacspecError(f"{folder}: no *.safetensors weights")
    weights: dict[str, mx.array] = {}
    for file in files:
        try:
            weights.update(mx.load(str(file)))
        except (RuntimeError, ValueError, OSError) as exc:
            raise MacspecError(f"{file}: cannot read the weights ({exc})") from None
    return weights


def quantize_like(module: nn.Module, config: dict[str, Any], weights: dict[str, mx.array]) -> None:
    """Quantize the layers the weights hold scales for, as mlx_lm.load does (a module the
    config names with its own settings: those)."""
    quantize_as_saved(module, config.get("quantization"), weights)


def load_into(module: nn.Module, weights: dict[str, mx.array], folder: Path) -> None:
    """Load the weights into the module, a mismatch said as one line naming the folder."""
    try:
        module.load_weights(list(weights.items()))
    except ValueError as exc:
        raise MacspecError(f"{folder}: the weights do not fit the config ({exc})") from None
    mx.eval(module.parameters())
