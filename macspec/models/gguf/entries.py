"""The derived folders in the macspec home, for `macspec cache` to list and `cache clear` to
remove: a GGUF file's (config, tokenizer, converted weights) and an Ollama MLX model's (config
and tokenizer only: its weights are read from the store's blobs). A removed folder is derived
again, and converted again, by the next load of its model."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from macspec.errors import MacspecError
from macspec.models.gguf.folder import gguf_source
from macspec.models.gguf.load import CONVERTED
from macspec.models.gguf.split import part_paths
from macspec.models.home import macspec_home
from macspec.models.stores.ollama import PREFIX as OLLAMA_PREFIX

GGUF, OLLAMA_MLX = "gguf", "ollama-mlx"
"""The kinds of derived folder."""
TITLES = {GGUF: "converted GGUF files", OLLAMA_MLX: "Ollama MLX models (config and tokenizer)"}
"""What `macspec cache` calls each kind."""


def gguf_root() -> Path:
    """Where derived GGUF folders live (`gguf_folder` makes them)."""
    return macspec_home() / "gguf"


def ollama_mlx_root() -> Path:
    """Where Ollama MLX models' folders live (`ollama_mlx.tensor_folder` makes them)."""
    return macspec_home() / "ollama"


def roots() -> dict[str, Path]:
    """Each kind's folder."""
    return {GGUF: gguf_root(), OLLAMA_MLX: ollama_mlx_root()}


@dataclass(frozen=True)
class DerivedFolder:
    """One derived folder and the file it came from."""

    folder: Path
    file: Path | None
    """The GGUF file it reads (an Ollama MLX model: its manifest); None when its config.json
    is unreadable (a damaged folder)."""
    file_exists: bool
    converted_bytes: int
    """The converted copies' size (one per layout used); 0 for a file `mx.load` reads."""
    bytes: int
    """The whole folder (converted weights, config, tokenizer)."""
    last_used: float
    """When a load last used it (the folder's modification time, touched by each load)."""

    store_names: tuple[str, ...] = ()
    """The Ollama names whose model blob its file is (`smollm2:latest`), sorted; else none."""
    kind: str = GGUF
    """GGUF or OLLAMA_MLX."""

    @property
    def name(self) -> str:
        """The name a user knows it by: its Ollama name, else the file's name ('model.gguf'),
        else the folder's."""
        if self.store_names:
            return self.store_names[0]
        return self.file.name if self.file is not None else self.folder.name

    def matches(self, name: str, files: set[Path]) -> bool:
        """Named by the name shown, an Ollama name, the file's or folder's name or path, or
        any part's name of a split model; `files` are what `name` resolves to (`named_files`)."""
        named = {self.folder.name, str(self.folder), self.name, *self.store_names}
        if name in named or name.removeprefix(OLLAMA_PREFIX) in self.store_names:
            return True
        if self.file is None:
            return False
        if self.folder.resolve() in files:  # an Ollama MLX model's name resolves to its folder
            return True
        parts = part_paths(self.file) or [self.file]
        return name in {p.name for p in parts} or self.file.resolve() in files


def named_files(name: str) -> set[Path]:
    """The files `name` names, resolved: a store name's model file (`ollama:NAME[:TAG]`,
    `NAME:TAG`, a bare Ollama `NAME`; an Ollama MLX model's folder), else a path (relative
    ones too); every part of a split model when one part is named."""
    from macspec.models.stores import find
    from macspec.models.stores.ollama_mlx import named_folder

    folder = named_folder(name)  # an Ollama MLX model: its folder, found without deriving it
    if folder is not None:
        return {folder.resolve()}
    try:
        found = find(name)
    except MacspecError:  # not in a store: a path, or nothing known
        found = None
    path = (found.path if found is not None else Path(name).expanduser()).resolve()
    return {p.resolve() for p in part_paths(path) or [path]}


def ollama_blob_names() -> dict[Path, tuple[str, ...]]:
    """Ollama's model blobs (resolved), each with the names `ollama list` shows for it."""
    from macspec.models.stores import ollama

    root = ollama.store_root()
    if not root.is_dir():
        return {}
    found: dict[Path, list[str]] = {}
    for name, manifest in ollama.manifests(root):
        try:
            blob = ollama.model_blob(ollama.read_manifest(manifest, name.short), root, name.short)
        except MacspecError:  # a damaged or foreign manifest names no blob we list
            continue
        found.setdefault(blob.resolve(), []).append(name.short)
    return {blob: tuple(sorted(names)) for blob, names in found.items()}


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _folders(root: Path) -> list[Path]:
    """A root's derived folders (half-written ones, hidden, left out)."""
    if not root.is_dir():
        return []
    return [f for f in root.iterdir() if f.is_dir() and not f.name.startswith(".")]


def _derived(folder: Path, source: Path | None, names: tuple[str, ...], kind: str):
    return DerivedFolder(
        folder=folder,
        file=source,
        file_exists=source is not None and source.is_file(),
        converted_bytes=sum(_size(folder / name) for name in CONVERTED.values()),
        bytes=sum(_size(p) for p in folder.rglob("*") if p.is_file()),
        last_used=folder.stat().st_mtime,
        store_names=names,
        kind=kind,
    )


def manifest_name(manifest: Path) -> tuple[str, ...]:
    """The name `ollama list` shows for a manifest (`manifests/<host>/<ns>/<model>/<tag>`)."""
    from macspec.models.stores.ollama import OllamaName

    parts = manifest.parts[-4:]
    return (OllamaName(*parts).short,) if len(parts) == 4 else ()


def derived_folders() -> list[DerivedFolder]:
    """Every derived folder, GGUF files' and Ollama MLX models', most recently used first."""
    from macspec.models.stores.ollama_entry import tensor_entry

    found = []
    blobs = ollama_blob_names() if _folders(gguf_root()) else {}
    for folder in _folders(gguf_root()):
        source = gguf_source(folder)
        names = blobs.get(source.resolve(), ()) if source is not None else ()
        found.append(_derived(folder, source, names, GGUF))
    for folder in _folders(ollama_mlx_root()):
        entry = tensor_entry(folder)
        manifest = Path(entry["manifest"]) if entry is not None else None
        names = manifest_name(manifest) if manifest is not None else ()
        found.append(_derived(folder, manifest, names, OLLAMA_MLX))
    return sorted(found, key=lambda entry: -entry.last_used)


def named_folders(name: str) -> list[DerivedFolder]:
    """The derived folders `name` names (`DerivedFolder.matches`)."""
    files = named_files(name)
    return [d for d in derived_folders() if d.matches(name, files)]


def remove(folders: list[DerivedFolder]) -> int:
    """Delete these folders; the bytes freed."""
    for entry in folders:
        shutil.rmtree(entry.folder, ignore_errors=True)
    return sum(entry.bytes for entry in folders)


def remove_all(root: Path) -> int:
    """Delete every derived folder under `root` (one of `roots`), and what an interrupted
    derivation left; the bytes freed."""
    if not root.is_dir():
        return 0
    freed = sum(_size(p) for p in root.rglob("*") if p.is_file())
    for child in root.iterdir():
        if child.is_dir():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)
    return freed
