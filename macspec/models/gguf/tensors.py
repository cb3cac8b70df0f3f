"""GGUF tensors as MLX weights, one converter per tensor type.

MLX's affine quantization keeps, per group of 32 values, a scale and a bias (value = scale * q
+ bias), q packed little-endian into uint32 words. llama.cpp's Q4_0, Q4_1 and Q8_0 blocks are
that shape (an fp16 scale, an fp16 minimum or an implied offset, 32 values), so their bits come
across unchanged: the layout `mx.load` gives them. A file of only `mx.load`'s types is read by
`mx.load` (one call, in C++), or tensor by tensor through `CONVERTERS`, which gives the same
arrays. A file with other types (K-quants, Q5_0, i-quants) is read through `kquants`: every
quantized tensor with float32 scales, so the whole model computes in float32, as gguf's own
dequantization does (`mx.load`'s float16 scales would make Q8_0 embeddings float16).
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx
import numpy as np
from gguf import GGMLQuantizationType as Q

from macspec.models.gguf import kquants
from macspec.models.gguf.header import GGUFHeader

Converter = Callable[[np.ndarray, tuple[int, ...]], dict[str, mx.array]]
"""A tensor's bytes (uint8) and row-major shape -> {"weight": ...} for a float tensor, or
{"weight", "scales", "biases"} in MLX's affine layout for a quantized one."""

GROUP_SIZE = 32
MX_LOAD_TYPES = frozenset({Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q8_0})
"""What `mx.load` reads from a GGUF itself."""


def _float(dtype: str) -> Converter:
    def convert(raw: np.ndarray, shape: tuple[int, ...]) -> dict[str, mx.array]:
        return {"weight": mx.array(raw.view(dtype).reshape(shape))}

    return convert


def _bf16(raw: np.ndarray, shape: tuple[int, ...]) -> dict[str, mx.array]:
    return {"weight": mx.array(raw.view("<u2").reshape(shape)).view(mx.bfloat16)}


def pack(q: np.ndarray, bits: int) -> np.ndarray:
    """Values below 2**bits (uint8, [rows, n]) packed as MLX packs them, for bits 4 and 8."""
    if bits == 4:
        q = q[..., 0::2] | (q[..., 1::2] << 4)
    return np.ascontiguousarray(q).view("<u4")


def _blocks(raw: np.ndarray, shape: tuple[int, ...], block_bytes: int) -> np.ndarray:
    rows = int(np.prod(shape[:-1], dtype=np.int64))
    return raw.reshape(rows, shape[-1] // GROUP_SIZE, block_bytes)


def _affine(
    q: np.ndarray, scales: np.ndarray, biases: np.ndarray, bits: int, shape: tuple[int, ...]
) -> dict[str, mx.array]:
    rows = q.shape[0]
    return {
        "weight": mx.array(pack(q.reshape(rows, -1), bits).reshape(*shape[:-1], -1)),
        "scales": mx.array(scales.reshape(*shape[:-1], -1)),
        "biases": mx.array(biases.reshape(*shape[:-1], -1)),
    }


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """A 4-bit block's 16 bytes as its 32 values in order: the low nibbles are values 0-15."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _q4_0(raw: np.ndarray, shape: tuple[int, ...]) -> dict[str, mx.array]:
    blocks = _blocks(raw, shape, 18)
    scales = blocks[..., :2].copy().view("<f2")[..., 0]
    return _affine(_nibbles(blocks[..., 2:]), scales, scales * np.float16(-8), 4, shape)


def _q4_1(raw: np.ndarray, shape: tuple[int, ...]) -> dict[str, mx.array]:
    blocks = _blocks(raw, shape, 20)
    scales = blocks[..., :2].copy().view("<f2")[..., 0]
    minimums = blocks[..., 2:4].copy().view("<f2")[..., 0]
    return _affine(_nibbles(blocks[..., 4:]), scales, minimums, 4, shape)


def _q8_0(raw: np.ndarray, shape: tuple[int, ...]) -> dict[str, mx.array]:
    blocks = _blocks(raw, shape, 34)
    scales = blocks[..., :2].copy().view("<f2")[..., 0]
    q = (blocks[..., 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
    return _affine(q, scales, scales * np.float16(-128), 8, shape)


CONVERTERS: dict[Q, Converter] = {
    Q.F32: _float("<f4"),
    Q.F16: _float("<f2"),
    Q.BF16: _bf16,
    Q.Q4_0: _q4_0,
    Q.Q4_1: _q4_1,
    Q.Q8_0: _q8_0,
}
"""Every tensor type macspec reads; another type is one more entry (and a test that it gives
the values `gguf.quants.dequantize` gives)."""


def readable_types() -> list[Q]:
    """Every tensor type macspec reads."""
    return [qtype for qtype in Q if qtype in CONVERTERS or kquants.convertible(qtype)]


def unreadable(header: GGUFHeader) -> list[tuple[str, Q]]:
    """The tensors of a type no converter reads, in file order."""
    readable = readable_types()
    return [(t.name, t.qtype) for t in header.tensors.values() if t.qtype not in readable]


def read_tensors(header: GGUFHeader, use_mx_load: bool = True) -> dict[str, mx.array]:
    """Every tensor, by GGUF name (`blk.0.attn_q.weight`, with `.scales`/`.biases` beside a
    quantized one), evaluated. `use_mx_load` False converts even what `mx.load` would read
    (tests compare the two)."""
    mx_loadable = all(t.qtype in MX_LOAD_TYPES for t in header.tensors.values())
    if use_mx_load and mx_loadable:
        return mx.load(str(header.path))
    out: dict[str, mx.array] = {}
    with open(header.path, "rb") as file:
        for tensor in header.tensors.values():
            file.seek(tensor.start)
            raw = np.frombuffer(file.read(tensor.nbytes), np.uint8)
            if mx_loadable or tensor.qtype in (Q.F32, Q.F16, Q.BF16):
                parts = CONVERTERS[tensor.qtype](raw, tensor.shape)
            else:
                name = f"{header.path}: tensor {tensor.name}"
                parts = kquants.convert(tensor.qtype, raw, tensor.shape, name=name)
            stem = tensor.name.removesuffix(".weight")
            out.update({stem + "." + part: value for part, value in parts.items()})
            mx.eval(list(parts.values()))  # one tensor's conversion at a time: peak memory
    return out
