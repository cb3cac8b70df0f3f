"""GGUF quantized blocks straight into MLX's affine quantized layout, exactly where the format
allows it.

MLX's affine quantization stores, per group of 32 values along a row, `value = scale * q + bias`
with q packed as a little-endian bit stream into uint32 words (32 values in `bits` words).
Every llama.cpp type whose blocks are, or nest, groups of 32 values that share one scale and
one offset is that form:

- Q4_K / Q5_K: 256-value super-blocks of 8 sub-blocks of 32, `w = d*sc*q - dmin*m` (fp16 d and
  dmin, 6-bit sc and m): scale `d*sc`, bias `-dmin*m`.
- Q4_0 / Q5_0 / Q8_0: `w = d*(q - offset)`: scale `d`, bias `-offset*d`.
- Q4_1 / Q5_1: `w = d*q + m`: scale `d`, bias `m`.

In each case `scale * q` is exact in float32 (at most 22 significant bits), so MLX's
`scale * q + bias` rounds once, where gguf's dequantizer rounds once: with float32 scales and
biases `mx.dequantize` gives gguf's floats bit for bit. float16 would round `d*sc` (17 bits).

Q6_K, Q3_K and Q2_K use sub-blocks of 16, which MLX's affine mode refuses (group sizes 32, 64,
128); the i-quants use codebooks. Those are dequantized with `gguf` one row chunk at a time and
kept as float16 (the exact layout) or requantized to an affine layout (the compact one:
`macspec.models.gguf.layout` says which, and why).

MXFP4 (gpt-oss's experts) is MLX's own `mxfp4` mode: the same block of 32 E2M1 values sharing
one E8M0 exponent, so its bits come across unchanged in either layout.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator

import mlx.core as mx
import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants

from macspec.errors import MacspecError

Q = GGMLQuantizationType

GROUP_SIZE = 32
"""MLX group size of every converted tensor (the sub-block size the exact types share)."""

CHUNK_VALUES = 1 << 18
"""Values converted per step: keeps the temporaries (unpacked values, float dequantization) in
a few MB, near the CPU's caches, whatever the tensor's size (measured: 4x faster than 64 MB)."""

FLOAT16_MAX = float(np.finfo(np.float16).max)

FLOAT_TYPES = {Q.F32: np.float32, Q.F16: np.float16}

Unpacked = tuple[np.ndarray, np.ndarray, np.ndarray]
"""Per chunk of blocks: packed MLX bytes [n, block_size*bits/8], scales and biases [n, groups]."""


def _half(blocks: np.ndarray, start: int) -> np.ndarray:
    """The fp16 at byte `start` of each block, as float32 [n, 1]."""
    return np.ascontiguousarray(blocks[:, start : start + 2]).view(np.float16).astype(np.float32)


def _pack_nibble_halves(qs: np.ndarray) -> np.ndarray:
    """Bytes whose low nibbles hold values 0..w-1 and high nibbles values w..2w-1 (llama.cpp's
    4-bit layout, along the last axis of width w) as MLX packs those 2w values: two
    consecutive values per byte, the first in the low nibble."""
    even, odd = qs[..., 0::2], qs[..., 1::2]
    low = (even & 0x0F) | (odd << 4)
    high = (even >> 4) | (odd & 0xF0)
    return np.concatenate([low, high], axis=-1)


def _pack_bits(values: np.ndarray, bits: int) -> np.ndarray:
    """Values below 2**bits, [n, m] with m a multiple of 8, as MLX's little-endian bit stream:
    each 8 values fill `bits` bytes. The 8 bytes of 8 values are read as one uint64 and their
    gaps closed in three steps (pairs, quads, the octet)."""
    n = values.shape[0]
    stream = np.ascontiguousarray(values).view(np.uint64).reshape(-1)
    for lane, low in ((8, 0x00FF00FF00FF00FF), (16, 0x0000FFFF0000FFFF), (32, 0xFFFFFFFF)):
        gap = np.uint64(lane // 8 * (8 - bits))
        stream = (stream & np.uint64(low)) | ((stream & ~np.uint64(low)) >> gap)
    return stream.view(np.uint8).reshape(-1, 8)[:, :bits].reshape(n, -1)


def _low_high_nibbles(qs: np.ndarray) -> np.ndarray:
    """llama.cpp's 4-bit layout (low nibbles first, then high nibbles) as values [n, 2w]."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _five_bit_legacy(blocks: np.ndarray, start: int) -> np.ndarray:
    """Q5_0 / Q5_1 values: 4 low bits from the nibbles at start+4, the fifth from the 32-bit
    mask at start."""
    high = np.unpackbits(blocks[:, start : start + 4], axis=-1, bitorder="little")
    return _low_high_nibbles(blocks[:, start + 4 :]) | (high << 4)


def _q4_0(blocks: np.ndarray) -> Unpacked:
    d = _half(blocks, 0)
    return _pack_nibble_halves(blocks[:, 2:]), d, -8 * d


def _q4_1(blocks: np.ndarray) -> Unpacked:
    return _pack_nibble_halves(blocks[:, 4:]), _half(blocks, 0), _half(blocks, 2)


def _q5_0(blocks: np.ndarray) -> Unpacked:
    d = _half(blocks, 0)
    return _pack_bits(_five_bit_legacy(blocks, 2), 5), d, -16 * d


def _q5_1(blocks: np.ndarray) -> Unpacked:
    return _pack_bits(_five_bit_legacy(blocks, 4), 5), _half(blocks, 0), _half(blocks, 2)


def _q8_0(blocks: np.ndarray) -> Unpacked:
    d = _half(blocks, 0)
    # int8 x + 128 is x's bit pattern with the top bit flipped
    return blocks[:, 2:] ^ np.uint8(0x80), d, -128 * d


def _k_scales(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K: scale d*sc and bias -dmin*m of the 8 sub-blocks, as gguf computes them."""
    sc, m = quants.Q4_K.get_scale_min(blocks[:, 4:16])
    return _half(blocks, 0) * sc.astype(np.float32), -(_half(blocks, 2) * m.astype(np.float32))


def _q4_k(blocks: np.ndarray) -> Unpacked:
    # 4 chunks of 32 bytes: sub-block 2c in the low nibbles of chunk c, 2c+1 in the high ones
    qs = blocks[:, 16:].reshape(-1, 4, 32)
    return _pack_nibble_halves(qs).reshape(len(blocks), -1), *_k_scales(blocks)


def _q5_k(blocks: np.ndarray) -> Unpacked:
    n = len(blocks)
    low = _low_high_nibbles(blocks[:, 48:].reshape(n, 4, 32)).reshape(n, 8, 32)
    # bit j of byte l of the 32-byte mask is the fifth bit of value l of sub-block j
    high = np.unpackbits(blocks[:, 16:48, None], axis=-1, bitorder="little").transpose(0, 2, 1)
    return _pack_bits((low | (high << 4)).reshape(n, -1), 5), *_k_scales(blocks)


def _mxfp4(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """MXFP4: byte 0 the E8M0 exponent, then 16 bytes of 32 E2M1 codes in llama.cpp's 4-bit
    order. llama.cpp doubles its value table and halves the exponent (`GGML_E8M0_TO_FP32_HALF`):
    the same numbers as MLX's `mxfp4`, whose codes and exponent byte are these."""
    return _pack_nibble_halves(blocks[:, 1:]), blocks[:, :1]


IQ4_CODEBOOK = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113])
"""llama.cpp's `kvalues_iq4nl`: integers spanning 240, so value + 128 is an exact 8-bit code."""


def _iq4_codes(qs: np.ndarray) -> np.ndarray:
    """Each group's 16 bytes (low nibbles values 0-15, high 16-31) as 8-bit codes."""
    indices = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)
    return (IQ4_CODEBOOK[indices] + 128).astype(np.uint8).reshape(len(qs), -1)


def _iq4_nl(blocks: np.ndarray) -> Unpacked:
    d = _half(blocks, 0)
    return _iq4_codes(blocks[:, 2:]), d, -128 * d


def _iq4_xs(blocks: np.ndarray) -> Unpacked:
    """d, 8 sub-block scales of 6 bits (low 4 in scales_l, high 2 in scales_h), 8 x 16 bytes."""
    high_bits = np.ascontiguousarray(blocks[:, 2:4]).view(np.uint16).astype(np.int32)
    low_bits, sub = blocks[:, 4:8].astype(np.int32), np.arange(8)
    six = ((low_bits[:, sub // 2] >> 4 * (sub % 2)) & 0xF) | (((high_bits >> 2 * sub) & 3) << 4)
    scale = _half(blocks, 0) * (six - 32).astype(np.float32)
    return _iq4_codes(blocks[:, 8:].reshape(len(blocks), 8, 16)), scale, -128 * scale


CODEBOOK_AFFINE: dict[Q, tuple[int, Callable[[np.ndarray], Unpacked]]] = {
    Q.IQ4_NL: (8, _iq4_nl),
    Q.IQ4_XS: (8, _iq4_xs),
}
"""Codebook types whose 8-bit affine form is exact (scale d, bias -128 d, per group of 32): what
the compact layout holds them in, rather than requantizing their floats."""


EXACT: dict[Q, tuple[int, Callable[[np.ndarray], Unpacked]]] = {
    Q.Q4_0: (4, _q4_0),
    Q.Q4_1: (4, _q4_1),
    Q.Q5_0: (5, _q5_0),
    Q.Q5_1: (5, _q5_1),
    Q.Q8_0: (8, _q8_0),
    Q.Q4_K: (4, _q4_k),
    Q.Q5_K: (5, _q5_k),
}
"""Types with an exact MLX affine form: (bits, the block unpacker)."""
HALF_SCALED = frozenset({Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0})
"""Exact types whose scale and bias are the block's fp16 values (or a power of two times one):
exact with float16 scales too. Q4_K's and Q5_K's `d*sc` need float32."""


def gguf_type(tensor_type: int | Q) -> Q:
    """The GGUF type of a tensor, from its number or enum; an unknown number is one line."""
    try:
        return Q(int(tensor_type))
    except ValueError:
        raise MacspecError(f"GGUF tensor type {int(tensor_type)} is unknown") from None


def is_exact(tensor_type: int | Q) -> bool:
    """True when the converted tensor equals gguf's dequantization bit for bit (floats and the
    types with an affine form of group 32)."""
    qtype = gguf_type(tensor_type)
    return qtype in EXACT or qtype in FLOAT_TYPES or qtype == Q.BF16 or qtype == Q.MXFP4


def affine_bits(tensor_type: int | Q, requantize_bits: int | None = None) -> int | None:
    """The MLX bit width the converted tensor has, or None when it is a plain float array."""
    qtype = gguf_type(tensor_type)
    if qtype in EXACT or qtype == Q.MXFP4:
        return 4 if qtype == Q.MXFP4 else EXACT[qtype][0]
    if qtype in FLOAT_TYPES or qtype == Q.BF16:
        return None
    return requantize_bits


@functools.cache
def convertible(qtype: Q) -> bool:
    """Whether `convert` reads the type: an exact form, a float, or gguf dequantizes it (tried
    on one zero block)."""
    if qtype in EXACT or qtype in FLOAT_TYPES or qtype in (Q.BF16, Q.MXFP4):
        return True
    try:
        quants.dequantize(np.zeros((1, GGML_QUANT_SIZES[qtype][1]), np.uint8), qtype)
    except NotImplementedError:
        return False
    return True


def check_convertible(tensor_type: int | Q, name: str = "tensor") -> None:
    """Refuse, in one line naming the type, what neither this module nor gguf can convert."""
    qtype = gguf_type(tensor_type)
    if not convertible(qtype):
        raise MacspecError(
            f"{name}: GGUF type {qtype.name} cannot be converted (gguf cannot dequantize it)"
        )


def _blocks(raw: np.ndarray, qtype: Q, shape: tuple[int, ...], name: str) -> np.ndarray:
    """The raw bytes as [n_blocks, type_size], after checking they are what `shape` needs."""
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    if not shape or shape[-1] % block_size:
        raise MacspecError(
            f"{name}: a {qtype.name} row holds a multiple of {block_size} values, not shape {shape}"
        )
    expected = int(np.prod(shape)) // block_size * type_size
    data = np.asarray(raw)
    if data.dtype != np.uint8 or data.size != expected:
        raise MacspecError(
            f"{name}: {qtype.name} data of shape {shape} is {data.size * data.itemsize} bytes,"
            f" expected {expected} (a truncated or damaged file)"
        )
    return data.reshape(-1, type_size)


def _damaged(name: str, qtype: Q, finite: np.ndarray, first_block: int) -> MacspecError:
    bad = first_block + int(np.argmin(finite.reshape(len(finite), -1).all(axis=-1)))
    return MacspecError(f"{name}: {qtype.name} block {bad} has a non-finite scale (damaged file)")


def _exact(
    blocks: np.ndarray, qtype: Q, shape: tuple[int, ...], scales_dtype: mx.Dtype, name: str
) -> dict[str, mx.array]:
    bits, unpack = EXACT.get(qtype) or CODEBOOK_AFFINE[qtype]
    cols = shape[-1]
    block_size = GGML_QUANT_SIZES[qtype][0]
    groups_per_block = block_size // GROUP_SIZE
    packed = np.empty((len(blocks), block_size * bits // 8), np.uint8)
    scales = np.empty((len(blocks), groups_per_block), np.float32)
    biases = np.empty_like(scales)
    chunk = max(1, CHUNK_VALUES // block_size)
    for start in range(0, len(blocks), chunk):
        stop = start + chunk
        packed[start:stop], scales[start:stop], biases[start:stop] = unpack(blocks[start:stop])
        finite = np.isfinite(scales[start:stop]) & np.isfinite(biases[start:stop])
        if not finite.all():
            raise _damaged(name, qtype, finite, start)
    groups = (*shape[:-1], cols // GROUP_SIZE)
    if scales_dtype == mx.float16 and max(np.abs(scales).max(), np.abs(biases).max()) > FLOAT16_MAX:
        scales_dtype = mx.float32  # a scale beyond float16's range: this tensor keeps float32
    return {
        "weight": mx.array(packed.view(np.uint32).reshape(*shape[:-1], cols * bits // 32)),
        "scales": mx.array(scales.reshape(groups)).astype(scales_dtype),
        "biases": mx.array(biases.reshape(groups)).astype(scales_dtype),
    }


def _float_chunks(blocks: np.ndarray, qtype: Q, cols: int, name: str) -> Iterator[np.ndarray]:
    """gguf's dequantization as float32 [rows, cols], a chunk of rows at a time, each checked."""
    block_size = GGML_QUANT_SIZES[qtype][0]
    blocks_per_row = cols // block_size
    rows = blocks.reshape(-1, blocks_per_row * blocks.shape[-1])
    chunk_rows = max(1, CHUNK_VALUES // cols)
    for start in range(0, len(rows), chunk_rows):
        # one call per chunk: gguf's array entry point splits it further, 16 rows at a time
        values = quants.dequantize(rows[start : start + chunk_rows], qtype)
        # two reductions, no temporary: a nan or inf anywhere makes one of them non-finite
        if not (np.isfinite(values.min()) and np.isfinite(values.max())):
            finite = np.isfinite(values).reshape(-1, block_size)
            raise _damaged(name, qtype, finite, start * blocks_per_row)
        yield values


def _dequantized(
    blocks: np.ndarray,
    qtype: Q,
    shape: tuple[int, ...],
    requantize: tuple[int, int] | None,
    scales_dtype: mx.Dtype,
    name: str,
) -> dict[str, mx.array]:
    """The types without an exact form: float16 (float32 where a value is beyond float16's
    range), or requantized to `requantize` (bits, group size) with scales in `scales_dtype`."""
    rows, cols = len(blocks) * GGML_QUANT_SIZES[qtype][0] // shape[-1], shape[-1]
    if requantize is not None:
        bits, group_size = requantize
        if cols % group_size:
            group_size = GROUP_SIZE  # every GGUF block type's rows hold whole groups of 32
        parts = []
        for values in _float_chunks(blocks, qtype, cols, name):
            weight, scales, biases = mx.quantize(mx.array(values), group_size, bits)
            parts.append((weight, scales.astype(scales_dtype), biases.astype(scales_dtype)))
            mx.eval(parts[-1])
        return {
            key: mx.concatenate([part[i] for part in parts]).reshape(*shape[:-1], -1)
            for i, key in enumerate(("weight", "scales", "biases"))
        }
    halves, done = np.empty((rows, cols), np.float16), 0
    for values in _float_chunks(blocks, qtype, cols, name):
        if max(-values.min(), values.max()) > FLOAT16_MAX:
            floats = np.concatenate(list(_float_chunks(blocks, qtype, cols, name)))
            return {"weight": mx.array(floats.reshape(shape))}
        halves[done : done + len(values)] = values
        done += len(values)
    return {"weight": mx.array(halves.reshape(shape))}


def _mxfp4_arrays(blocks: np.ndarray, shape: tuple[int, ...]) -> dict[str, mx.array]:
    packed, exponents = _mxfp4(blocks)
    return {
        "weight": mx.array(packed.view(np.uint32).reshape(*shape[:-1], -1)),
        "scales": mx.array(exponents.reshape(*shape[:-1], -1)),
    }


def convert(
    tensor_type: int | Q,
    raw_blocks: np.ndarray,
    shape: tuple[int, ...],
    *,
    requantize_bits: int | None = None,
    requantize_group: int = GROUP_SIZE,
    scales_dtype: mx.Dtype = mx.float32,
    name: str = "tensor",
) -> dict[str, mx.array]:
    """One GGUF tensor as MLX weights: {"weight", "scales", "biases"} (affine, group 32) for the
    exact types and for requantized ones, {"weight"} for floats and the other types kept as
    float16 (float32 for a tensor with values beyond float16's range).

    `raw_blocks` is the tensor's data as `gguf.GGUFReader` maps it (uint8, any shape); `shape`
    is the logical row-major shape (GGUF lists it innermost first: pass it reversed).
    `requantize_bits` requantizes the types without an exact form (groups of `requantize_group`)
    instead of keeping float16; `scales_dtype` float16 halves the scales' memory but rounds
    K-quant scales (not exact). MXFP4 gives {"weight", "scales"} in MLX's `mxfp4` mode.
    Wrong sizes, non-finite scales and types gguf cannot dequantize are one-line MacspecErrors.
    """
    qtype = gguf_type(tensor_type)
    shape = tuple(int(dim) for dim in shape)
    check_convertible(qtype, name)
    if qtype in FLOAT_TYPES:
        data = np.asarray(raw_blocks).view(FLOAT_TYPES[qtype])
        if data.size != int(np.prod(shape)):
            raise MacspecError(f"{name}: {qtype.name} data does not hold shape {shape}")
        return {"weight": mx.array(data.reshape(shape))}
    if qtype == Q.BF16:
        data = np.asarray(raw_blocks).view(np.uint16)
        if data.size != int(np.prod(shape)):
            raise MacspecError(f"{name}: BF16 data does not hold shape {shape}")
        return {"weight": mx.array(data.reshape(shape)).view(mx.bfloat16)}
    blocks = _blocks(raw_blocks, qtype, shape, name)
    # a damaged scale (inf, nan) is reported by the finiteness checks, not as numpy warnings
    if qtype == Q.MXFP4:
        return _mxfp4_arrays(blocks, shape)
    with np.errstate(invalid="ignore", over="ignore"):
        if qtype in EXACT or (requantize_bits is not None and qtype in CODEBOOK_AFFINE):
            return _exact(blocks, qtype, shape, scales_dtype, name)
        requantize = None if requantize_bits is None else (requantize_bits, requantize_group)
        return _dequantized(blocks, qtype, shape, requantize, scales_dtype, name)
