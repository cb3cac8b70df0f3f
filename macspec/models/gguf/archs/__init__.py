"""The GGUF architectures macspec reads: one module each (its config keys, tensor names, and
what llama.cpp's converter did to it, undone), registered in `ARCHITECTURES`, as mlx-lm keeps
one file per model."""

from __future__ import annotations

from macspec.errors import MacspecError
from macspec.models.gguf.archs.base import Architecture
from macspec.models.gguf.archs.gemma2 import Gemma2
from macspec.models.gguf.archs.gemma3 import Gemma3
from macspec.models.gguf.archs.gemma3n import Gemma3n
from macspec.models.gguf.archs.gpt_oss import GptOss
from macspec.models.gguf.archs.granite import Granite
from macspec.models.gguf.archs.granite_hybrid import GraniteHybrid
from macspec.models.gguf.archs.llama import Llama, Mistral3
from macspec.models.gguf.archs.phi3 import Phi3
from macspec.models.gguf.archs.qwen import Qwen2, Qwen3
from macspec.models.gguf.archs.qwen3moe import Qwen3Moe
from macspec.models.gguf.archs.qwen35 import Qwen35, Qwen35Moe
from macspec.models.gguf.archs.smollm3 import SmolLM3
from macspec.models.gguf.header import GGUFHeader

ARCHITECTURES: dict[str, Architecture] = {
    arch.name: arch
    for arch in (
        Llama(),
        Mistral3(),
        Qwen2(),
        Qwen3(),
        Qwen3Moe(),
        Gemma2(),
        Gemma3(),
        Phi3(),
        GptOss(),
        Qwen35(),
        Qwen35Moe(),
        GraniteHybrid(),
        Gemma3n(),
        SmolLM3(),
        Granite(),
    )
}
"""GGUF's `general.architecture` -> how macspec reads it."""


def unsupported(architecture: str) -> str | None:
    """Why GGUF files of `architecture` are not read here, naming those that are (the words
    `run`, `serve` and `macspec models` all say); None when it is read."""
    if architecture in ARCHITECTURES:
        return None
    return (
        f"architecture '{architecture}' is not supported for GGUF files "
        f"(supported: {', '.join(ARCHITECTURES)})"
    )


def architecture_of(header: GGUFHeader) -> Architecture:
    """The file's architecture, or one line naming the one it is and those supported."""
    why = unsupported(header.architecture)
    if why is not None:
        raise MacspecError(f"{header.path}: {why}")
    return ARCHITECTURES[header.architecture]


def notices(header: GGUFHeader) -> list[str]:
    """What the user should know about the file that is not an error (a part not used)."""
    arch = ARCHITECTURES.get(header.architecture)
    return arch.notices(header) if arch is not None else []
