"""Ollama's MLX models, read in place: a manifest of `image.tensor` layers (Ollama's x/create),
each blob a safetensors file (no extension) holding one tensor, or several, and when quantized
`X.weight` (packed U32) with `X.weight.scale` and, for affine modes, `X.weight.bias`; the blob's
`__metadata__` names `quant_type` and `group_size` (per tensor, `X.weight.quant_type`, in a
mixed blob). `image.json` layers hold config.json, tokenizer.json and the rest of the source
folder's JSON files (x/create/pipeline.go's importConfigBlobs).

What loading derives (config.json with mlx-lm's per-module `quantization`, the tokenizer files)
is written once to the macspec home, keyed by the manifest's bytes; the weights are read from
the blobs where they lie (`ollama_mlx_load`). Nothing in the store is written.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

from macspec.errors import MacspecError
from macspec.models.home import macspec_home, write_folder_whole
from macspec.models.stores.describe import Description, tokenizer_files_digest
from macspec.models.stores.ollama import (  # noqa: F401  (is_tensor_manifest: read from here too)
    MODEL,
    PREFIX,
    TENSOR,
    blob_path,
    find_manifest,
    is_tensor_manifest,
    layers_of,
    parse_name,
    read_manifest,
    store_root,
)
from macspec.models.stores.ollama_entry import (  # noqa: F401  (mlx_name: read from here too)
    DRAFT_CONFIG,
    ENTRY,
    mlx_name,
    tensor_entry,
)
from macspec.models.stores.ollama_mtp import MTP_CONFIG, carries_mtp, mtp_config

JSON_LAYER = "application/vnd.ollama.image.json"
FORMAT = 2
"""The derived folder's layout; a change here derives every folder again."""
DRAFT_PREFIX = "draft."
"""x/create/draft.go: a draft's tensors, namespaced inside the target's manifest."""

QUANT_TYPES = {
    "int4": (64, 4, "affine"),
    "int8": (64, 8, "affine"),
    "mxfp4": (32, 4, "mxfp4"),
    "nvfp4": (16, 4, "nvfp4"),
    "mxfp8": (32, 8, "mxfp8"),
}
"""Ollama's quantization types: default group size, bits, MLX mode (x/quant/quant.go)."""
ALIASES = {"fp4": "int4", "q4": "int4", "fp8": "int8", "q8": "int8"}
"""x/quant/quant.go's Canonical: the older names of int4 and int8."""


def _blobs(data: dict[str, Any], root: Path, given: str, media_type: str) -> dict[str, Path]:
    """Each layer's name and blob, checked whole: one line for a bad digest, a missing blob or
    a blob shorter than the manifest says (an interrupted pull)."""
    found = {}
    for layer in layers_of(data, media_type):
        name = layer.get("name")
        path = blob_path(layer.get("digest"), root)
        if not isinstance(name, str) or path is None:
            raise MacspecError(f"{given}: a layer of its manifest has no name or no sha256 digest")
        if not path.is_file():
            raise MacspecError(f"{given}: the blob of {name} ({path}) is missing; pull it again")
        size = layer.get("size")
        if isinstance(size, int) and path.stat().st_size != size:
            raise MacspecError(
                f"{given}: the blob of {name} ({path}) is cut ({path.stat().st_size} of "
                f"{size} bytes); pull it again"
            )
        found[name] = path
    return found


def tensor_blobs(
    data: dict[str, Any], root: Path, given: str, draft: bool = False
) -> dict[str, Path]:
    """The target's tensor blobs by tensor name (a draft's, `draft.`, left out), or with
    `draft` the draft's alone."""
    blobs = _blobs(data, root, given, TENSOR)
    return {k: v for k, v in blobs.items() if k.startswith(DRAFT_PREFIX) == draft}


def json_blobs(data: dict[str, Any], root: Path, given: str) -> dict[str, Path]:
    """The JSON layers by name (`config.json`, `tokenizer.json`, `draft/config.json`, ...)."""
    blobs = _blobs(data, root, given, JSON_LAYER)
    for needed in ("config.json", "tokenizer.json"):
        if needed not in blobs:
            raise MacspecError(f"{given}: its manifest has no {needed} layer")
    return blobs


def manifest_json_blobs(manifest: Path) -> dict[str, Path]:
    """The JSON layers of the manifest file `manifest`, from the store it lies in."""
    data = read_manifest(manifest, str(manifest))
    root = manifest.parents[4]  # manifests/<host>/<namespace>/<model>/<tag>
    return json_blobs(data, root, str(manifest))


def read_config(blobs: dict[str, Path], given: str) -> dict[str, Any]:
    """The model's config.json, with its architecture checked to be one mlx-lm builds."""
    try:
        config = json.loads(blobs["config.json"].read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = None
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise MacspecError(f"{given}: its config.json layer is not a model's config")
    from importlib.util import find_spec

    from mlx_lm.utils import MODEL_REMAPPING

    model_type = MODEL_REMAPPING.get(config["model_type"], config["model_type"])
    if find_spec(f"mlx_lm.models.{model_type}") is None:
        raise MacspecError(
            f"{given}: architecture {config['model_type']} is not one mlx-lm builds "
            "(upgrade mlx-lm, or use a GGUF build of the model)"
        )
    return config


def blob_header(path: Path, given: str) -> dict[str, Any]:
    """A blob's safetensors header (tensor entries and `__metadata__`), checked to describe
    no more bytes than the blob holds."""
    try:
        with path.open("rb") as file:
            size = int.from_bytes(file.read(8), "little")
            header = json.loads(file.read(size)) if 0 < size < 100_000_000 else None
        length = path.stat().st_size
    except (OSError, ValueError):
        header = None
    if not isinstance(header, dict):
        raise MacspecError(f"{given}: blob {path} is not a safetensors file")
    ends = [e["data_offsets"][1] for k, e in header.items() if k != "__metadata__"]
    if 8 + size + max(ends, default=0) > length:
        raise MacspecError(f"{given}: blob {path} is cut; pull the model again")
    return header


def module_quantization(
    header: dict[str, Any], given: str, prefix: str = ""
) -> dict[str, dict[str, Any]]:
    """mlx-lm's quantization of each module a blob holds quantized (its mlx-lm path, less
    `prefix`: its group size, bits and mode), from the blob's metadata (x/create/quantize.go)."""
    metadata = header.get("__metadata__") or {}
    found = {}
    for key in header:
        if not key.endswith(".weight") or f"{key}.scale" not in header:
            continue
        kind = metadata.get(f"{key}.quant_type") or metadata.get("quant_type") or ""
        kind = ALIASES.get(kind.lower(), kind.lower())
        if kind not in QUANT_TYPES:
            raise MacspecError(f"{given}: tensor {key} has quantization {kind!r}, not one MLX runs")
        group, bits, mode = QUANT_TYPES[kind]
        group = int(metadata.get(f"{key}.group_size") or metadata.get("group_size") or group)
        module = mlx_name(key).removesuffix(".weight").removeprefix(prefix)
        found[module] = {"group_size": group, "bits": bits, "mode": mode}
    return found


def quantization(blobs: dict[str, Path], given: str, prefix: str = "") -> dict[str, Any] | None:
    """mlx-lm's `quantization` config: the most common setting, and every quantized module by
    name (mlx-lm then quantizes exactly those); None when nothing is quantized."""
    modules: dict[str, dict[str, Any]] = {}
    for path in blobs.values():
        modules.update(module_quantization(blob_header(path, given), given, prefix))
    if not modules:
        return None
    common = Counter(tuple(q.items()) for q in modules.values()).most_common(1)[0][0]
    return {**dict(common), **modules}


def manifest_key(manifest: Path) -> str:
    """The derived folder's key: the manifest's bytes (a new pull is a new manifest)."""
    data = manifest.read_bytes()
    return hashlib.sha256(f"{FORMAT}\0".encode() + data).hexdigest()[:32]


def folder_of(manifest: Path) -> Path:
    """Where the folder derived from `manifest` lies, derived yet or not."""
    return macspec_home() / "ollama" / f"{manifest.parent.name[:40]}-{manifest_key(manifest)}"


def named_folder(name: str) -> Path | None:
    """The folder of the MLX model `[ollama:]NAME[:TAG]` names in Ollama's store, derived yet
    or not (nothing is written); None for any other name."""
    parsed = parse_name(name.removeprefix(PREFIX))
    root = store_root()
    manifest = find_manifest(parsed, root) if parsed is not None and root.is_dir() else None
    if manifest is None:
        return None
    try:
        data = read_manifest(manifest, name)
    except MacspecError:
        return None
    return folder_of(manifest) if is_tensor_manifest(data) else None


def tensor_folder(data: dict[str, Any], manifest: Path, root: Path, given: str) -> Path:
    """The model folder mlx-lm loads for a tensor-layer manifest (derived on first use); one
    line for a manifest whose blobs are missing or cut, or whose architecture mlx-lm lacks."""
    tensors = tensor_blobs(data, root, given)
    jsons = json_blobs(data, root, given)
    folder = folder_of(manifest)
    if (folder / "config.json").is_file():
        return folder
    config = read_config(jsons, given)
    mtp = mtp_config(tensors, config, manifest, given)  # from the config as Ollama keeps it
    quantized = quantization(tensors, given)
    if quantized is not None:
        config["quantization"] = quantized
    config[ENTRY] = {"manifest": str(manifest), "blobs": sorted({str(p) for p in tensors.values()})}
    written = {"config.json": config}
    draft = draft_config(data, manifest, root, given, jsons)
    if draft is not None:
        written[DRAFT_CONFIG] = draft
    if mtp is not None:
        written[MTP_CONFIG] = mtp
    _write_whole(folder, jsons, written)
    return folder


def draft_config(
    data: dict[str, Any], manifest: Path, root: Path, given: str, jsons: dict[str, Path]
) -> dict[str, Any] | None:
    """The config.json of the draft a manifest carries (x/create/draft.go: `draft.` tensors,
    a draft/config.json layer), naming its blobs as the target's names its own, with its
    quantization by the drafter's module names (less `draft.`, and `model.` as load_dflash
    reads z-lab's names); None without a draft."""
    tensors = tensor_blobs(data, root, given, draft=True)
    if not tensors or DRAFT_CONFIG not in jsons:
        return None
    try:
        config = json.loads(jsons[DRAFT_CONFIG].read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = None
    if not isinstance(config, dict):
        raise MacspecError(f"{given}: its {DRAFT_CONFIG} layer is not a JSON object")
    quantized = quantization(tensors, given, DRAFT_PREFIX)
    if quantized is not None:
        names = {k.removeprefix("model."): v for k, v in quantized.items()}
        config["quantization"] = names
    blobs = sorted({str(p) for p in tensors.values()})
    config[ENTRY] = {"manifest": str(manifest), "blobs": blobs, "prefix": DRAFT_PREFIX}
    return config


def _write_whole(folder: Path, jsons: dict[str, Path], written: dict[str, dict]) -> None:
    """The manifest's JSON files (a draft's under draft/), the configs in `written` as
    derived; no weights."""

    def fill(partial: Path) -> None:
        for name, path in jsons.items():
            if name not in written and ".." not in Path(name).parts:
                (partial / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, partial / name)
        for name, config in written.items():
            (partial / name).parent.mkdir(parents=True, exist_ok=True)
            (partial / name).write_text(json.dumps(config, indent=2), encoding="utf-8")

    write_folder_whole(folder, fill, "the Ollama model folder")


def carried_drafts(data: dict[str, Any], jsons: dict[str, Path]) -> tuple[str, ...]:
    """The drafters a manifest carries: 'dflash' for a `draft.` model whose draft/config.json
    is a DFlash block drafter's, else its architecture (x/create/draft.go)."""
    if not any(str(layer.get("name", "")).startswith(DRAFT_PREFIX) for layer in data["layers"]):
        return ()
    try:
        config = json.loads(jsons[DRAFT_CONFIG].read_text(encoding="utf-8"))
    except (KeyError, OSError, ValueError):
        return ("draft",)
    if isinstance(config, dict) and "dflash_config" in config:
        return ("dflash",)
    kinds = config.get("architectures") if isinstance(config, dict) else None
    return (str(kinds[0]),) if isinstance(kinds, list) and kinds else ("draft",)


def describe_tensor_manifest(
    data: dict[str, Any], root: Path, given: str, file_type: str | None
) -> Description:
    """A tensor-layer manifest described from its layers and its config.json (no weight read):
    one line, as `--model` says it, for missing or cut blobs or an architecture mlx-lm lacks."""
    from macspec.models.memory import estimate

    tensors = tensor_blobs(data, root, given)
    jsons = json_blobs(data, root, given)
    config = read_config(jsons, given)
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    context = text.get("max_position_embeddings")
    context = context if isinstance(context, int) and context > 0 else None
    size = sum(path.stat().st_size for path in set(tensors.values()))
    vocab = text.get("vocab_size")
    return Description(
        "mlx",
        size,
        file_type,
        config["model_type"],
        context,
        estimate(size, [config], context) if context else None,
        tokenizer_files_digest(jsons),
        vocab if isinstance(vocab, int) else None,
        carried_drafts(data, jsons) + (("mtp",) if carries_mtp(tensors, config) else ()),
    )
