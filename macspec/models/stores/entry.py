"""What a store name resolves to: a path the loader takes, and what the store said about it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from macspec.errors import MacspecError

GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True)
class StoreModel:
    """One model found in Ollama's or LM Studio's store, read where it lies."""

    name: str
    """The name as the user gave it (`ollama:qwen3:8b`, `lmstudio:pub/repo`)."""
    store: str
    """'ollama' or 'lmstudio'."""
    path: Path
    """A GGUF file (an Ollama blob has no `.gguf` suffix) or an MLX model folder."""
    params: dict[str, Any] = field(default_factory=dict)
    """Ollama's `params` layer (stop, temperature, ...): defaults that flags override."""
    notes: tuple[str, ...] = ()
    """One line each for what is there but not used (a vision projector, an adapter)."""
    draft: Path | None = None
    """A draft model the store keeps beside it (Ollama's `image.draft` layer), if any."""


def is_gguf(path: Path) -> bool:
    """The file starts with GGUF's magic (what the loader checks too); False when unreadable."""
    try:
        with path.open("rb") as file:
            return file.read(4) == GGUF_MAGIC
    except OSError:
        return False


def require_gguf(path: Path, name: str, what: str) -> Path:
    """`path` when it is a readable GGUF file, else one line naming `name` and `what` it is."""
    if not path.exists():
        raise MacspecError(f"{name}: {what} {path} is missing")
    if not path.is_file():
        raise MacspecError(f"{name}: {what} {path} is not a file")
    if not is_gguf(path):
        raise MacspecError(f"{name}: {what} {path} is not a GGUF file")
    return path
