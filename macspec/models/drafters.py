"""Drafters that read the target, loaded from their published folders: MTP heads (mlx-vlm's
`qwen3_5_mtp` format) and DFlash block drafters (z-lab's format; EAGLE-3 heads are read in
eagle3.py); and the conversion of an original Hugging Face checkpoint's `mtp.*` tensors into
an MTP drafter folder.

A folder's kind is told by its config.json; every check that the config can answer (hidden
size, target architecture, tapped layers) runs before a weight is read.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import mlx.core as mx

from macspec.errors import MacspecError
from macspec.models.heads import load_into, quantize_like, read_config, read_weights, text_config
from macspec.models.stores.ollama_entry import tensor_entry
from macspec.models.stores.ollama_mtp import CENTRED_NORMS

MTP_TYPE = "qwen3_5_mtp"
GENERIC_MTP_TYPE = "mtp"
"""macspec's own MTP head format for other targets (the demo's): the same names, the same
config, with text_config the target's own and a decoder block of its architecture."""
MTP_TARGETS = ("qwen3_5", "qwen3_5_moe")
NORM_SUFFIXES = (
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
    "q_norm.weight",
    "k_norm.weight",
    "norm.weight",
    "pre_fc_norm_embedding.weight",
    "pre_fc_norm_hidden.weight",
)
"""RMSNorm weights of an MTP head. Hugging Face stores them centred on 0 (the layer multiplies
by 1 + w); MLX's RMSNorm multiplies by w, so a conversion adds 1, once."""


def drafter_kind(folder: Path) -> str:
    """'mtp', 'dflash', 'eagle3', 'mtp-checkpoint' (an original checkpoint with mtp.* tensors to
    convert), or 'model' (a draft model mlx_lm.load reads)."""
    from macspec.models.eagle3 import eagle3_format

    config = read_config(folder)
    if config.get("model_type") in (MTP_TYPE, GENERIC_MTP_TYPE):
        return "mtp"
    if eagle3_format(config) is not None:
        return "eagle3"
    if "dflash_config" in config:
        return "dflash"
    index = folder / "model.safetensors.index.json"
    if index.is_file() and any(_is_mtp_key(k) for k in _index_keys(index)):
        return "mtp-checkpoint"
    return "model"


def _target_type(target_config: dict[str, Any]) -> str:
    return str(text_config(target_config).get("model_type", target_config.get("model_type", "")))


# -- MTP heads ----------------------------------------------------------------------------------
def check_mtp(folder: Path, config: dict[str, Any], target_config: dict[str, Any]) -> dict:
    """The head's text config, after the checks its config can answer (no weights read)."""
    kind = _target_type(target_config)
    head = text_config(config)
    if config.get("model_type") == MTP_TYPE:
        if kind not in MTP_TARGETS and target_config.get("model_type") not in MTP_TARGETS:
            raise MacspecError(
                f"{folder} is an MTP head for Qwen3.5/3.6 (qwen3_5, qwen3_5_moe) targets; "
                f"this target is {target_config.get('model_type', '?')}"
            )
    elif head.get("model_type") != target_config.get("model_type"):
        raise MacspecError(
            f"{folder} is an MTP head for {head.get('model_type', '?')} targets; this target "
            f"is {target_config.get('model_type', '?')}"
        )
    want, got = text_config(target_config).get("hidden_size"), head.get("hidden_size")
    if want != got:
        raise MacspecError(f"{folder} is an MTP head for hidden size {got}; the target's is {want}")
    return head


def mtp_norm_mean(weights: dict[str, mx.array]) -> float:
    norms = [w for k, w in weights.items() if k.endswith(NORM_SUFFIXES) and w.ndim == 1]
    if not norms:
        return 1.0
    return float(mx.mean(mx.concatenate([w.astype(mx.float32) for w in norms])).item())


def load_mtp(folder: Path, target_config: dict[str, Any]):
    """An MTP head from a drafter folder; its norms must be shifted exactly once."""
    from macspec.engine.drafters.mtp import MTPHead

    config = read_config(folder)
    head_config = check_mtp(folder, config, target_config)
    weights = read_weights(folder)
    entry = tensor_entry(folder)
    if entry is not None and entry.get(CENTRED_NORMS):  # an Ollama target's own mtp.* tensors
        weights = shift_norms(weights)
    mean = mtp_norm_mean(weights)
    if not 0.5 <= mean <= 1.5:
        state = (
            "shifted twice (about 2)"
            if mean > 1.5
            else "not shifted (about 0, as a raw checkpoint)"
        )
        raise MacspecError(
            f"{folder}: its norm weights average {mean:.2f}, {state}; an MTP folder's average "
            "about 1. Convert from the original checkpoint (--draft-model REPO) instead"
        )
    layers = 1 + max(
        (int(m.group(1)) for k in weights if (m := re.match(r"layers\.(\d+)\.", k))), default=0
    )
    if config.get("model_type") == MTP_TYPE:
        head_config = {**head_config, "model_type": "qwen3_5"}
    head = MTPHead(head_config, num_layers=layers)
    quantize_like(head, config, weights)
    load_into(head, weights, folder)
    return head


def _is_mtp_key(key: str) -> bool:
    return key.startswith("mtp.") or ".mtp." in key


def _index_keys(index: Path) -> list[str]:
    try:
        return list(json.loads(index.read_text(encoding="utf-8")).get("weight_map", {}))
    except (OSError, ValueError):
        return []


def shift_norms(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """An MTP head's norms centred on 0 (Hugging Face's) as MLX's RMSNorm takes them: + 1."""
    return {
        k: v + 1.0 if k.endswith(NORM_SUFFIXES) and v.ndim == 1 else v for k, v in weights.items()
    }


def sanitize_mtp(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """An original checkpoint's mtp.* tensors -> the head's names: prefix gone, norms + 1 (once),
    MoE experts stacked as mlx-lm's switch_mlp."""
    out = shift_norms({key[key.index("mtp.") + len("mtp.") :]: v for key, v in weights.items()})
    for key in [k for k in out if k.endswith(".experts.gate_up_proj")]:
        prefix = key[: -len(".experts.gate_up_proj")]
        gate, up = mx.split(out.pop(key), 2, axis=-2)
        out[f"{prefix}.switch_mlp.gate_proj.weight"] = gate
        out[f"{prefix}.switch_mlp.up_proj.weight"] = up
        out[f"{prefix}.switch_mlp.down_proj.weight"] = out.pop(f"{prefix}.experts.down_proj")
    per_expert = re.compile(r"(.*)\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
    groups: dict[tuple[str, str], dict[int, str]] = {}
    for key in out:
        if match := per_expert.fullmatch(key):
            prefix, expert, projection = match.groups()
            groups.setdefault((prefix, projection), {})[int(expert)] = key
    for (prefix, projection), keys in groups.items():
        out[f"{prefix}.switch_mlp.{projection}.weight"] = mx.stack(
            [out.pop(keys[e]) for e in sorted(keys)]
        )
    return out


def mtp_head_config(target_config: dict[str, Any]) -> dict[str, Any]:
    """The config.json of an MTP drafter folder for a target's own mtp.* tensors."""
    head = dict(text_config(target_config))
    return {
        "model_type": MTP_TYPE,
        "text_config": head,
        "block_size": int(head.get("mtp_num_hidden_layers", 1)) + 2,
        "tie_word_embeddings": head.get("tie_word_embeddings", False),
    }


def convert_mtp_checkpoint(source: Path, out: Path, shards: list[Path] | None = None) -> Path:
    """Write an MTP drafter folder from an original checkpoint: only the shards the index names
    for mtp.* tensors are read (or `shards`, already fetched). Written to a temporary folder,
    renamed when complete."""
    config = read_config(source)
    index = source / "model.safetensors.index.json"
    weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map", {})
    files = sorted({weight_map[k] for k in weight_map if _is_mtp_key(k)})
    if not files:
        raise MacspecError(f"{source}: the checkpoint has no mtp.* tensors")
    mtp: dict[str, mx.array] = {}
    for path in shards or [source / f for f in files]:
        mtp.update({k: v for k, v in mx.load(str(path)).items() if _is_mtp_key(k)})
    weights = sanitize_mtp(mtp)
    head_config = mtp_head_config(config)
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    (partial / "config.json").write_text(json.dumps(head_config, indent=2))
    mx.save_safetensors(str(partial / "model.safetensors"), weights, metadata={"format": "mlx"})
    if out.exists():
        shutil.rmtree(out)
    partial.rename(out)
    return out


# -- DFlash ------------------------------------------------------------------------------------
def check_dflash(folder: Path, config: dict[str, Any], target_config: dict[str, Any]):
    """The drafter's config, after the checks it can answer (no weights read)."""
    from macspec.engine.drafters.dflash import DFlashConfig

    try:
        parsed = DFlashConfig.from_dict(config)
    except (KeyError, TypeError, ValueError) as exc:
        raise MacspecError(f"{folder}: not a DFlash config ({exc})") from None
    depth = text_config(target_config).get("num_hidden_layers")
    if isinstance(depth, int) and any(not 0 <= i < depth for i in parsed.target_layer_ids):
        raise MacspecError(
            f"{folder} reads target layers {list(parsed.target_layer_ids)}, but the target has "
            f"{depth} decoder layers (0 to {depth - 1})"
        )
    vocab = text_config(target_config).get("vocab_size")
    if isinstance(vocab, int) and not 0 <= parsed.mask_token_id < vocab:
        raise MacspecError(
            f"{folder}: mask_token_id {parsed.mask_token_id} is not an id of the target's "
            f"{vocab}-token vocabulary"
        )
    return parsed


def load_dflash(folder: Path, target_config: dict[str, Any]):
    from macspec.engine.drafters.dflash import DFlashModel

    config = read_config(folder)
    parsed = check_dflash(folder, config, target_config)
    target_hidden = text_config(target_config).get("hidden_size", parsed.hidden_size)
    weights = {k.removeprefix("model."): v for k, v in read_weights(folder).items()}
    model = DFlashModel(parsed, target_hidden)
    quantize_like(model, config, weights)
    load_into(model, weights, folder)
    return model
