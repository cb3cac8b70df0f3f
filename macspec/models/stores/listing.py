"""Every model on this machine: Ollama's store, LM Studio's, and the Hugging Face cache, each
described from metadata alone. One bad entry is listed as unreadable, with why; it never stops
the listing."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

from macspec.errors import MacspecError
from macspec.models.gguf.split import first_parts
from macspec.models.stores import lmstudio, ollama, ollama_mlx
from macspec.models.stores.describe import Description, describe_gguf, describe_mlx

STORES = ("ollama", "lmstudio", "hf")


@dataclass(frozen=True)
class LocalModel:
    """One model found on this machine."""

    name: str
    """What `--model` takes to run it (`qwen3:8b`, `lmstudio:pub/repo`, `org/name`, a path)."""
    store: str
    """'ollama', 'lmstudio' or 'hf' (the Hugging Face cache)."""
    path: Path | None
    """The GGUF file or model folder (an Ollama MLX model: its manifest); None when even that
    could not be found."""
    about: Description | None
    """Its metadata; None when unreadable."""
    error: str | None = None
    """Why it cannot be run (one line: unreadable, or a GGUF architecture macspec does not
    read, whose metadata `about` still holds); None when it can."""

    @property
    def runnable(self) -> bool:
        """Read, and of a kind macspec runs: what pairs, drafts and is served."""
        return self.about is not None and self.error is None


def _entry(name: str, store: str, path: Path | None, describe: Callable[[], Description]):
    try:
        return LocalModel(name, store, path, describe())
    except MacspecError as exc:
        return LocalModel(name, store, path, None, str(exc))
    except (OSError, ValueError, KeyError, TypeError, AttributeError, struct.error) as exc:
        return LocalModel(name, store, path, None, f"{type(exc).__name__}: {exc}".splitlines()[0])


def _gguf_entry(name: str, store: str, path: Path, file_type: str | None = None) -> LocalModel:
    """A GGUF file's row; one of an architecture macspec does not read says so, in the words
    `run` gives, its metadata kept."""
    from macspec.models.gguf.archs import unsupported  # mlx: not at start-up

    model = _entry(name, store, path, partial(describe_gguf, path, file_type))
    why = unsupported(model.about.architecture or "?") if model.about is not None else None
    return model if why is None else replace(model, error=f"{name}: {why}")


def _ollama_file_type(data: dict, root: Path) -> str | None:
    """The quantization Ollama's config blob names (`file_type`), if it says."""
    path = ollama.blob_path((data.get("config") or {}).get("digest"), root)
    try:
        config = json.loads(path.read_text(encoding="utf-8")) if path else None
    except (OSError, ValueError):
        return None
    value = config.get("file_type") if isinstance(config, dict) else None
    return value if isinstance(value, str) and value else None


def ollama_models() -> Iterator[LocalModel]:
    root = ollama.store_root()
    for name, manifest in ollama.manifests(root):
        short = name.short
        try:
            data = ollama.read_manifest(manifest, short)
            if ollama_mlx.is_tensor_manifest(data):  # MLX weights, one blob per tensor
                file_type = _ollama_file_type(data, root)
                describe = partial(
                    ollama_mlx.describe_tensor_manifest, data, root, short, file_type
                )
                yield _entry(short, "ollama", manifest, describe)
                continue
            blob = ollama.model_blob(data, root, short)
        except MacspecError as exc:
            yield LocalModel(short, "ollama", None, None, str(exc))
            continue
        file_type = _ollama_file_type(data, root)
        yield _gguf_entry(short, "ollama", blob, file_type)


def lmstudio_models() -> Iterator[LocalModel]:
    seen: set[tuple[str, str]] = set()
    for root in lmstudio.store_roots():
        for folder in lmstudio.repos(root):
            key = (folder.parent.name, folder.name)
            if key in seen:  # the older store's copy: the name takes the current one
                continue
            seen.add(key)
            name = f"{lmstudio.PREFIX}{key[0]}/{key[1]}"
            if lmstudio.is_mlx_folder(folder):
                yield _entry(name, "lmstudio", folder, lambda f=folder: describe_mlx(f))
                continue
            files = lmstudio.model_files(folder)
            for file in files:
                full = name if len(files) == 1 else f"{name}/{file.name}"
                yield _gguf_entry(full, "lmstudio", file)
            if not files:
                yield LocalModel(name, "lmstudio", folder, None, "no GGUF file and no MLX model")


def hf_models() -> Iterator[LocalModel]:
    from macspec.models import hub

    cache = hub.hf_cache_dir()
    for repo_folder in sorted(cache.glob("models--*")) if cache.is_dir() else ():
        repo = repo_folder.name.removeprefix("models--").replace("--", "/", 1)
        snapshot = _snapshot(repo_folder)
        if snapshot is None:
            yield LocalModel(repo, "hf", None, None, "no snapshot (an interrupted download)")
            continue
        if (snapshot / "config.json").is_file():
            if hub.is_complete(snapshot):
                yield _entry(repo, "hf", snapshot, lambda s=snapshot: describe_mlx(s))
            else:
                yield LocalModel(repo, "hf", snapshot, None, "incomplete download")
        gguf_files = [f for f in sorted(snapshot.rglob("*.gguf")) if not lmstudio.is_projector(f)]
        for file in first_parts(gguf_files):
            yield _gguf_entry(str(file), "hf", file)


def _snapshot(repo_folder: Path) -> Path | None:
    """The snapshot `refs/main` points to, else the newest one."""
    try:
        commit = (repo_folder / "refs" / "main").read_text().strip()
        if (repo_folder / "snapshots" / commit).is_dir():
            return repo_folder / "snapshots" / commit
    except OSError:
        pass
    snapshots = [p for p in (repo_folder / "snapshots").glob("*") if p.is_dir()]
    return max(snapshots, key=lambda p: p.stat().st_mtime) if snapshots else None


def local_models() -> list[LocalModel]:
    """Everything on this machine, store by store (Ollama, LM Studio, the HF cache); a bad
    MACSPEC_GGUF_LAYOUT is one line, not a reason on every GGUF's row."""
    from macspec.models.gguf.layout import default_layout  # mlx: not at start-up

    default_layout()
    return [*ollama_models(), *lmstudio_models(), *hf_models()]


def store_places() -> dict[str, str]:
    """Where each store is looked for, for the listing's caption."""
    from macspec.models import hub

    return {
        "ollama": str(ollama.store_root()),
        "lmstudio": " and ".join(str(r) for r in lmstudio.store_roots()),
        "hf": str(hub.hf_cache_dir()),
    }


def describe_path(path: Path) -> Description:
    """A GGUF file or a model folder, described from its metadata (a folder derived from an
    Ollama MLX manifest: from the manifest, whose blobs hold its weights)."""
    entry = ollama_mlx.tensor_entry(path) if path.is_dir() else None
    if entry is not None:
        manifest = Path(entry["manifest"])
        data = ollama.read_manifest(manifest, str(manifest))
        root = manifest.parents[4]  # manifests/<host>/<namespace>/<model>/<tag>
        file_type = _ollama_file_type(data, root)
        return ollama_mlx.describe_tensor_manifest(data, root, str(manifest), file_type)
    return describe_mlx(path) if path.is_dir() else describe_gguf(path)
