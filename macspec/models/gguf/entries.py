"""The derived GGUF folders in the macspec home (config, tokenizer, converted weights), for
`macspec cache` to list and `cache clear` to remove: a removed folder is derived again, and
converted again, by the next load of its file."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from macspec.models.gguf.folder import gguf_source
from macspec.models.gguf.load import CONVERTED
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
    """converted.safetensors' size; 0 for a file `mx.load` reads (nothing converted)."""
    bytes: int
    """The whole folder (converted weights, config, tokenizer)."""
    last_used: float
    """When a load last used it (the folder's modification time, touched by each load)."""

    @property
    def name(self) -> str:
        """The file's name ('model.gguf'), else the folder's."""
        return self.file.name if self.file is not None else self.folder.name

    def matches(self, name: str) -> bool:
        """Named by the file's name or path, or the folder's name or path."""
        named = {self.folder.name, str(self.folder), self.name}
        return name in named or (self.file is not None and name == str(self.file))


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
                converted_bytes=_size(folder / CONVERTED),
                bytes=sum(_size(p) for p in files),
                last_used=folder.stat().st_mtime,
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
