"""Tensors of another model in the same GGUF file (Ollama writes Gemma 3's vision tower into the
text model's file: `v.` and `mm.` tensors), left out where the header is read, so no reader reads
or counts them. Apart from the architectures' modules so that listing a store, which reads
headers, never imports MLX."""

from __future__ import annotations

from dataclasses import replace

from macspec.models.gguf.header import GGUFHeader

FOREIGN_PREFIXES: dict[str, tuple[str, ...]] = {"gemma3": ("v.", "mm.")}
"""By `general.architecture`: the name prefixes of tensors that are not the text model's."""


def is_foreign(architecture: str, name: str) -> bool:
    return name.startswith(FOREIGN_PREFIXES.get(architecture, ()))


def without_foreign(header: GGUFHeader) -> GGUFHeader:
    """The header without another model's tensors; any other header as it is."""
    prefixes = FOREIGN_PREFIXES.get(header.architecture)
    if prefixes is None or not any(name.startswith(prefixes) for name in header.tensors):
        return header
    kept = {n: entry for n, entry in header.tensors.items() if not n.startswith(prefixes)}
    return replace(header, tensors=kept)
