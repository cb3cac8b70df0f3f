"""How a folder derived from an Ollama MLX manifest is known: its config.json's entry naming the
manifest and the blobs its weights lie in. A leaf module: the loader and the drafter heads ask it
without importing the store's reader."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

ENTRY = "ollama_mlx"
"""config.json's entry naming the blobs the weights are read from: {"manifest", "blobs"}."""


DRAFT_CONFIG = "draft/config.json"
"""x/create/draft.go: the draft's config.json layer (its other JSON files beside it)."""

_STACKED_EXPERTS = re.compile(r"\.mlp\.experts\.(\d+\.)?(gate_proj|up_proj|down_proj)\.")


def mlx_name(name: str) -> str:
    """A tensor's Ollama name as mlx-lm's modules call it: `X.weight.scale` -> `X.scales`,
    `X.weight.bias` -> `X.biases`, `X.weight.global_scale` -> `X.global_scale` (nvfp4's),
    experts (stacked [E, out, in] or one per index) -> `switch_mlp` (what mlx-lm's MoE
    models' sanitize makes of the Hugging Face names)."""
    if name.endswith(".weight.global_scale"):
        name = name.removesuffix(".weight.global_scale") + ".global_scale"
    elif name.endswith(".weight.scale"):
        name = name.removesuffix(".weight.scale") + ".scales"
    elif name.endswith(".weight.bias"):
        name = name.removesuffix(".weight.bias") + ".biases"
    return _STACKED_EXPERTS.sub(r".mlp.switch_mlp.\2.", name)


def tensor_entry(folder: Path) -> dict[str, Any] | None:
    """A derived folder's `ollama_mlx` entry ({"manifest", "blobs"}), or None for any other."""
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    entry = config.get(ENTRY) if isinstance(config, dict) else None
    return entry if isinstance(entry, dict) and isinstance(entry.get("blobs"), list) else None
