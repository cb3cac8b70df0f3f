"""The derived GGUF folders in the macspec home (config, tokenizer, converted weights), for
`macspec cache` to list and `cache clear` to remove: a removed folder is derived again, and
converted again, by the next load of its file."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from macspec.errors import MacspecError
from macspec.models.gguf.folder import gguf_source
from macspec.models.gguf.load import CONVERTED
from macspec.models.gguf.split import part_paths
from macspec.models.home import macspec_home


def gguf_root() -> Path:
    """Where derived GGUF folders live (`gguf_folder` makes them)."""
    return macspec_home() / "gguf"


@dataclass(frozen=True)
class DerivedFolder:
    """One derived folder and the file it came from."""

    folder: Path
    file: Path | None
    """The GGUF file it reads; None when its config.json is unreadable (a damaged folder)."""
    file_exists: bool
    converted_bytes: int
    """The converted copies' size (one per layout used); 0 for a file `mx.load` reads."""
    bytes: int
    """The whole folder (converted weights, config, tokenizer)."""
    last_used: float
    """When a load last used it (the folder's modification time, touched by each load)."""

    store_names: tuple[str, ...] = ()
    """The Ollama names whose model blob its file is (`smollm2:latest`), sorted; else none."""

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
        if name in named:
            return True
        if self.file is None:
            return False
        parts = part_paths(self.file) or [self.file]
        return name in {p.name for p in parts} or self.file.resolve() in files


def named_files(name: str) -> set[Path]:
    """The files `name` names, resolved: a store name's model file (`ollama:NAME[:TAG]`,
    `NAME:TAG`, a bare Ollama `NAME`), else a path (relative ones too); every part of a split
    model when one part is named."""
    from macspec.models.stores import find

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


def derived_folders() -> list[DerivedFolder]:
    """Every derived folder, most recently used first (half-written ones, hidden, left out)."""
    root = gguf_root()
    if not root.is_dir():
        return []
    blobs = ollama_blob_names()
    found = []
    for folder in root.iterdir():
        if folder.name.startswith(".") or not folder.is_dir():
            continue
        source = gguf_source(folder)
        files = [p for p in folder.rglob("*") if p.is_file()]
        found.append(
            DerivedFolder(
                folder=folder,
                file=source,
                file_exists=source is not None and source.is_file(),
                converted_bytes=sum(_size(folder / name) for name in CONVERTED.values()),
                bytes=sum(_size(p) for p in files),
                last_used=folder.stat().st_mtime,
                store_names=blobs.get(source.resolve(), ()) if source is not None else (),
            )
        )
    return sorted(found, key=lambda entry: -entry.last_used)


def remove(folders: list[DerivedFolder]) -> int:
    """Delete these folders; the bytes freed."""
    for entry in folders:
        shutil.rmtree(entry.folder, ignore_errors=True)
    return sum(entry.bytes for entry in folders)


def remove_all() -> int:
    """Delete every derived folder, and what an interrupted derivation left; the bytes freed."""
    root = gguf_root()
    if not root.is_dir():
        return 0
    freed = sum(_size(p) for p in root.rglob("*") if p.is_file())
    for child in root.iterdir():
        if child.is_dir():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)
    return freed
