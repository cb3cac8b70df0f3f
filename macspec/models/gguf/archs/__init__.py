"""The GGUF architectures macspec reads: one module each (its config keys, tensor names, and
what llama.cpp's converter did to it, undone), registered in `ARCHITECTURES`, as mlx-lm keeps
one file per model."""

from __future__ import annotations

from macspec.errors import MacspecError
from macspec.models.gguf.archs.base import Architecture
from macspec.models.gguf.archs.gemma3 import Gemma3
from macspec.models.gguf.archs.llama import Llama
from macspec.models.gguf.archs.qwen import Qwen2, Qwen3
from macspec.models.gguf.header import GGUFHeader

ARCHITECTURES: dict[str, Architecture] = {
    arch.name: arch for arch in (Llama(), Qwen2(), Qwen3(), Gemma3())
}
"""GGUF's `general.architecture` -> how macspec reads it."""


def architecture_of(header: GGUFHeader) -> Architecture:
    """The file's architecture, or one line naming the one it is and those supported."""
    arch = ARCHITECTURES.get(header.architecture)
    if arch is None:
        raise MacspecError(
            f"{header.path}: architecture '{header.architecture}' is not supported for GGUF "
            f"files (supported: {', '.join(ARCHITECTURES)})"
        )
    return arch
