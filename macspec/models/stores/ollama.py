"""Ollama's store, read in place: `$OLLAMA_MODELS` (else `~/.ollama/models`) holds
`manifests/<host>/<namespace>/<model>/<tag>` (JSON, OCI-style) and `blobs/sha256-<hex>`.

Names follow Ollama's own parser (types/model/name.go): `model[:tag]`, `namespace/model[:tag]`,
`host/namespace/model[:tag]`; the defaults are `registry.ollama.ai`, `library` and `latest`, and
matching ignores case as Ollama's does. Nothing here writes to the store.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from macspec.errors import MacspecError
from macspec.models.stores.entry import StoreModel, require_gguf

PREFIX = "ollama:"
DEFAULT_HOST = "registry.ollama.ai"
DEFAULT_NAMESPACE = "library"
DEFAULT_TAG = "latest"

MODEL = "application/vnd.ollama.image.model"
PARAMS = "application/vnd.ollama.image.params"
PROJECTOR = "application/vnd.ollama.image.projector"
ADAPTER = "application/vnd.ollama.image.adapter"
DRAFT = "application/vnd.ollama.image.draft"
TENSOR = "application/vnd.ollama.image.tensor"
"""Newer manifests: one layer per safetensors tensor (`name=`), beside a JSON config layer."""

_PART = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,79}$")
_NAMESPACE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]{0,79}$")
_HOST = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,349}$")
_DIGEST = re.compile(r"^sha256[:-][0-9a-fA-F]{64}$")


def store_root() -> Path:
    """Ollama's models folder: `OLLAMA_MODELS`, else `~/.ollama/models` (as Ollama decides)."""
    configured = os.environ.get("OLLAMA_MODELS", "").strip().strip("'\"")
    return Path(configured).expanduser() if configured else Path.home() / ".ollama" / "models"


@dataclass(frozen=True)
class OllamaName:
    """A fully qualified Ollama model name."""

    host: str
    namespace: str
    model: str
    tag: str

    @property
    def parts(self) -> tuple[str, str, str, str]:
        return (self.host, self.namespace, self.model, self.tag)

    @property
    def short(self) -> str:
        """The name as `ollama list` shows it (Ollama's DisplayShortest)."""
        head = ""
        if self.host.lower() != DEFAULT_HOST:
            head = f"{self.host}/{self.namespace}/"
        elif self.namespace.lower() != DEFAULT_NAMESPACE:
            head = f"{self.namespace}/"
        return f"{head}{self.model}:{self.tag}"


def parse_name(text: str) -> OllamaName | None:
    """`text` as Ollama's CLI reads it, defaults filled in; None when Ollama would refuse it."""
    tag = DEFAULT_TAG
    if text.rfind(":") > text.rfind("/"):
        text, _, tag = text.rpartition(":")
    parts = text.split("/")
    if len(parts) > 3 or not all(parts):
        return None
    host, namespace = DEFAULT_HOST, DEFAULT_NAMESPACE
    if len(parts) == 3:
        host, namespace, model = parts
    elif len(parts) == 2:
        namespace, model = parts
    else:
        (model,) = parts
    ok = _HOST.match(host) and _NAMESPACE.match(namespace) and _PART.match(model)
    ok = ok and _PART.match(tag)
    return OllamaName(host, namespace, model, tag) if ok else None


def manifests(root: Path | None = None) -> list[tuple[OllamaName, Path]]:
    """Every manifest in the store, by name (Ollama's own glob: four levels under manifests/)."""
    folder = (root or store_root()) / "manifests"
    found = []
    for path in sorted(folder.glob("*/*/*/*")):
        if path.is_file():
            found.append((OllamaName(*path.relative_to(folder).parts), path))
    return found


def find_manifest(name: OllamaName, root: Path) -> Path | None:
    """The manifest file of `name`: its exact path, else one that matches ignoring case."""
    exact = root / "manifests" / Path(*name.parts)
    if exact.is_file():
        return exact
    wanted = tuple(part.lower() for part in name.parts)
    for other, path in manifests(root):
        if tuple(part.lower() for part in other.parts) == wanted:
            return path
    return None


def blob_path(digest: Any, root: Path) -> Path | None:
    """Where a layer's blob lies (`sha256:<hex>` -> blobs/sha256-<hex>); None for a bad digest."""
    if not isinstance(digest, str) or not _DIGEST.match(digest):
        return None
    return root / "blobs" / digest.replace(":", "-")


def read_manifest(path: Path, given: str) -> dict[str, Any]:
    """A manifest's JSON, checked to hold a list of layers; anything else is one line."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        reason = type(exc).__name__ if isinstance(exc, OSError) else "not JSON"
        raise MacspecError(f"{given}: cannot read its manifest {path} ({reason})") from None
    layers = data.get("layers") if isinstance(data, dict) else None
    if not isinstance(layers, list) or not all(isinstance(layer, dict) for layer in layers):
        raise MacspecError(f"{given}: its manifest {path} has no list of layers")
    return data


def layers_of(data: dict[str, Any], media_type: str) -> list[dict[str, Any]]:
    return [layer for layer in data["layers"] if layer.get("mediaType") == media_type]


def model_blob(data: dict[str, Any], root: Path, given: str) -> Path:
    """The GGUF blob of a manifest's model layer, checked; MLX tensor-layer manifests (see
    ollama_mlx) and missing or foreign blobs are one line each."""
    models = layers_of(data, MODEL)
    if not models:
        if layers_of(data, TENSOR):
            raise MacspecError(f"{given}: an MLX model (one layer per tensor), no GGUF blob")
        raise MacspecError(f"{given}: its manifest has no model layer ({MODEL})")
    path = blob_path(models[0].get("digest"), root)
    if path is None:
        raise MacspecError(f"{given}: its model layer has no valid sha256 digest")
    return require_gguf(path, given, "model blob")


def read_params(data: dict[str, Any], root: Path, given: str) -> dict[str, Any]:
    """The `params` layer's JSON object (stop, temperature, ...); none is {}."""
    params: dict[str, Any] = {}
    for layer in layers_of(data, PARAMS):
        path = blob_path(layer.get("digest"), root)
        try:
            loaded = json.loads(path.read_text(encoding="utf-8")) if path else None
        except (OSError, UnicodeDecodeError, ValueError):
            loaded = None
        if not isinstance(loaded, dict):
            raise MacspecError(f"{given}: its params layer {path} is not a readable JSON object")
        params.update(loaded)
    return params


TensorFolder = Callable[[dict[str, Any], Path, Path, str], Path]
"""(manifest data, manifest path, store root, the name given) -> the derived model folder."""


def is_tensor_manifest(data: dict[str, Any]) -> bool:
    """A manifest in Ollama's MLX layout: tensor layers and no GGUF model layer."""
    return bool(layers_of(data, TENSOR)) and not layers_of(data, MODEL)


def resolve(
    spec: str, given: str | None = None, tensor_folder: TensorFolder | None = None
) -> StoreModel:
    """The model Ollama calls `spec` (`qwen3:8b`, `ns/model:tag`, ...), read from its store;
    an MLX manifest becomes the folder `tensor_folder` derives (stores.ollama_mlx's)."""
    given = given or spec
    name = parse_name(spec)
    if name is None:
        raise MacspecError(
            f"{given}: not an Ollama model name (NAME[:TAG], NAMESPACE/NAME[:TAG] or "
            "HOST/NAMESPACE/NAME[:TAG])"
        )
    root = store_root()
    if not root.is_dir():
        raise MacspecError(
            f"{given}: Ollama's store {root} does not exist (set OLLAMA_MODELS to where it is)"
        )
    path = find_manifest(name, root)
    if path is None:
        raise MacspecError(f"{given}: not in Ollama's store {root}{_nearest(name, root)}")
    data = read_manifest(path, given)
    if is_tensor_manifest(data):  # MLX weights: a derived folder, blobs in place
        if tensor_folder is None:
            raise MacspecError(f"{given}: an MLX model (one blob per tensor), not a GGUF one")
        model = tensor_folder(data, path, root, given)
    else:
        model = model_blob(data, root, given)
    notes = []
    if layers_of(data, PROJECTOR):
        notes.append(f"{given} has a vision projector: the text model runs, images are not read")
    if layers_of(data, ADAPTER):
        notes.append(f"{given} has a LoRA adapter layer, which macspec does not apply")
    drafts = [blob_path(layer.get("digest"), root) for layer in layers_of(data, DRAFT)]
    return StoreModel(
        given,
        "ollama",
        model,
        read_params(data, root, given),
        tuple(notes),
        drafts[0] if drafts else None,
    )


def _nearest(name: OllamaName, root: Path) -> str:
    """'; nearest: a, b' from the store's own names (as `ollama run` suggests), else a hint."""
    import difflib

    shorts = [other.short for other, _ in manifests(root)]
    close = difflib.get_close_matches(name.short, shorts, n=3, cutoff=0.5)
    if not close:
        close = [s for s in shorts if s.split(":")[0].lower() == name.model.lower()][:3]
    if close:
        return f"; nearest: {', '.join(close)}"
    return f"; pull it with: ollama pull {name.short}"
