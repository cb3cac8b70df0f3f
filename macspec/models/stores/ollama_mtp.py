"""The MTP head inside an Ollama MLX model's own weights (Qwen3.5: `mtp.*` tensor layers, kept
with Hugging Face's names and norms centred on 0; x/models/qwen3_5's loadMTPHead reads them and
shifts the norms): derived as an MTP drafter folder beside the target's, its weights read from
the same blobs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

MTP_PREFIX = "mtp."
MTP_CONFIG = "mtp/config.json"
"""Where the derived folder keeps the head's config (its weights stay in the store's blobs)."""
CENTRED_NORMS = "centred_norms"
"""The entry's flag: the head's RMSNorm weights are Hugging Face's (1 + w), shifted once on load."""


def _text(config: dict[str, Any]) -> dict[str, Any]:
    text = config.get("text_config")
    return text if isinstance(text, dict) else config


def carries_mtp(tensors: dict[str, Path], config: dict[str, Any]) -> bool:
    """Whether the target's tensors hold an MTP head macspec's MTP drafter runs (`mtp.fc`,
    as x/models/qwen3_5 asks, on a Qwen3.5 target)."""
    from macspec.models.drafters import MTP_TARGETS

    kinds = {config.get("model_type"), _text(config).get("model_type")}
    has_fc = any(name.startswith(f"{MTP_PREFIX}fc.") for name in tensors)
    return has_fc and bool(kinds & set(MTP_TARGETS))


def mtp_config(
    tensors: dict[str, Path], config: dict[str, Any], manifest: Path, given: str
) -> dict[str, Any] | None:
    """The config.json of the MTP drafter folder for a target's own `mtp.*` tensors (the
    format a converted checkpoint's head has), naming their blobs; None without a head."""
    if not carries_mtp(tensors, config):
        return None
    from macspec.models.drafters import mtp_head_config
    from macspec.models.stores.ollama_entry import ENTRY
    from macspec.models.stores.ollama_mlx import quantization

    heads = {k: v for k, v in tensors.items() if k.startswith(MTP_PREFIX)}
    head = mtp_head_config(config)
    quantized = quantization(heads, given, MTP_PREFIX)
    if quantized is not None:
        head["quantization"] = quantized
    blobs = sorted({str(p) for p in heads.values()})
    entry = {"manifest": str(manifest), "blobs": blobs, "prefix": MTP_PREFIX, CENTRED_NORMS: True}
    head[ENTRY] = entry
    return head
