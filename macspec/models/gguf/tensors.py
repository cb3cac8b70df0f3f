"""GGUF tensors as MLX weights, one converter per tensor type.

MLX's affine quantization keeps, per group of 32 values, a scale and a bias (value = scale * q
+ bias), q packed little-endian into uint32 words. llama.cpp's Q4_0, Q4_1 and Q8_0 blocks are
that shape (an fp16 scale, an fp16 minimum or an implied offset, 32 values), so their bits come
across unchanged: the layout `mx.load` gives them (tests hold the arrays equal). Every file is
read tensor by tensor through `CONVERTERS`. A file with other types (K-quants, Q5_0, i-quants) is
read through `kquants` in the layout asked for (`layout.py`): compact, its scales in float16 and
the types without an affine form requantized; or exact, every quantized tensor with float32
scales, so the whole model computes in float32 as gguf's own dequantization does.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from contextlib import ExitStack
from pathlib import Path
from typing import BinaryIO

import mlx.core as mx
import numpy as np
from gguf import GGMLQuantizationType as Q

from macspec.errors import MacspecError
from macspec.models.gguf import kquants
from macspec.models.gguf.header import GGUFHeader, TensorEntry
from macspec.models.gguf.layout import Layout, requantized, scales_dtype
from macspec.models.gguf.report import Progress

Converter = Callable[[np.ndarray, tuple[int, ...]], dict[str, mx.array]]
"""A tensor's bytes (uint8) and row-major shape -> {"weight": ...} for a float tensor, or
{"weight", "scales", "biases"} in MLX's affine layout for a quantized one."""

GROUP_SIZE = 32


def _float(dtype: str) -> Converter:
    def convert(raw: np.ndarray, shape: tuple[int, ...]) -> dict[str, mx.array]:
        return {"weight": mx.array(raw.view(dtype).reshape(shape))}

    return convert


def _bf16(raw: np.ndarray, shape: tuple[int, ...]) -> dict[str, mx.array]:
    return {"weight": mx.array(raw.view("<u2").reshape(shape)).view(mx.bfloat16)}


def _blocks(raw: np.ndarray, shape: tuple[int, ...], block_bytes: int) -> mx.array:
    """The tensor's blocks as an MLX array [rows, groups, block bytes]: the bit work below runs
    in MLX (on the GPU of a Mac), one copy out of the file's bytes."""
    rows = int(np.prod(shape[:-1], dtype=np.int64))
    return mx.array(raw).reshape(rows, shape[-1] // GROUP_SIZE, block_bytes)


def _affine(
    packed: mx.array, scales: mx.array, biases: mx.array, shape: tuple[int, ...]
) -> dict[str, mx.array]:
    """MLX's arrays from per-group packed bytes ([rows, groups, bytes]), scales and biases."""
    return {
        "weight": mx.contiguous(packed).view(mx.uint32).reshape(*shape[:-1], -1),
        "scales": scales.reshape(*shape[:-1], -1),
        "biases": biases.reshape(*shape[:-1], -1),
    }


def _nibbles_packed(qs: mx.array) -> mx.array:
    """A 4-bit block's 16 bytes (values 0-15 in the low nibbles, 16-31 in the high ones) as
    MLX packs its 32 values in order: two a byte, the first in the low nibble."""
    even, odd = qs[..., 0::2], qs[..., 1::2]
    return mx.concatenate([(even & 0x0F) | (odd << 4), (even >> 4) | (odd & 0xF0)], axis=-1)


def _half(blocks: mx.array, start: int) -> mx.array:
    """The fp16 each block holds at byte `start` (its scale, or its minimum)."""
    return mx.contiguous(blocks[..., start : start + 2]).view(mx.float16)[..., 0]


def _offset(scales: mx.array, offset: int) -> tuple[mx.array, mx.array]:
    """Scales and biases `-offset * scale` in float16, or both in float32 where a bias is beyond
    float16's range (a scale above 65504 / offset: rare, but then no bias becomes inf)."""
    biases = scales.astype(mx.float32) * -offset
    if mx.abs(biases).max().item() > kquants.FLOAT16_MAX:
        return scales.astype(mx.float32), biases
    return scales, biases.astype(mx.float16)


def _q4_0(raw: np.ndarray, shape: tuple[int, ...]) -> dict[str, mx.array]:
    blocks = _blocks(raw, shape, 18)
    return _affine(_nibbles_packed(blocks[..., 2:]), *_offset(_half(blocks, 0), 8), shape)


def _q4_1(raw: np.ndarray, shape: tuple[int, ...]) -> dict[str, mx.array]:
    blocks = _blocks(raw, shape, 20)
    return _affine(_nibbles_packed(blocks[..., 4:]), _half(blocks, 0), _half(blocks, 2), shape)


def _q8_0(raw: np.ndarray, shape: tuple[int, ...]) -> dict[str, mx.array]:
    blocks = _blocks(raw, shape, 34)
    q = blocks[..., 2:] ^ 0x80  # int8 x as uint8 x + 128: its sign bit flipped
    return _affine(q, *_offset(_half(blocks, 0), 128), shape)


CONVERTERS: dict[Q, Converter] = {
    Q.F32: _float("<f4"),
    Q.F16: _float("<f2"),
    Q.BF16: _bf16,
    Q.Q4_0: _q4_0,
    Q.Q4_1: _q4_1,
    Q.Q8_0: _q8_0,
}
"""The types `mx.load` reads, converted to the arrays it gives; every other type goes through
`kquants.convert`."""
FLOAT_TYPES = frozenset({Q.F32, Q.F16, Q.BF16})


def exactness(header: GGUFHeader, layout: Layout) -> tuple[dict[str, int], dict[str, int]]:
    """Tensors by type: (converted exactly, not: rounded scales, requantized or float16)."""
    exact: dict[str, int] = {}
    inexact: dict[str, int] = {}
    for tensor in header.tensors.values():
        counts = exact if _exact_in(tensor.qtype, layout) else inexact
        counts[tensor.qtype.name] = counts.get(tensor.qtype.name, 0) + 1
    return exact, inexact


def _exact_in(qtype: Q, layout: Layout) -> bool:
    """Whether a tensor of `qtype` dequantizes to gguf's floats in this file and layout: float16
    scales hold the legacy types' fp16 scales exactly, not the K-quants' `d*sc`."""
    if qtype in FLOAT_TYPES or qtype in kquants.HALF_SCALED or qtype == Q.MXFP4:
        return True
    if qtype == Q.IQ4_NL:  # compact: its block's fp16 d and -128 d, bit for bit
        return layout is Layout.COMPACT
    return kquants.is_exact(qtype) and layout is Layout.EXACT


def needs_conversion(header: GGUFHeader) -> bool:
    """A file with a type `mx.load` does not read (K-quants, Q5_0, i-quants): read through
    kquants, converted once and cached."""
    return any(tensor.qtype not in CONVERTERS for tensor in header.tensors.values())


def tensor_bytes(qtype: Q, values: int, stored: int, scale_bytes: int, layout: Layout) -> int:
    """One converted tensor's bytes: a quantized one at MLX's packed size plus a scale and a
    bias per group of 32 (MXFP4: one exponent byte); a float kept as stored; one without an
    affine form as float16 (exact) or requantized (compact)."""
    if qtype in FLOAT_TYPES:
        return stored
    if qtype == Q.MXFP4:
        return values // 2 + values // GROUP_SIZE
    bits = kquants.affine_bits(qtype)
    if bits is not None:
        return values * bits // 8 + values // GROUP_SIZE * 2 * scale_bytes
    if layout is Layout.EXACT:
        return 2 * values
    bits, group = requantized(qtype)
    return values * bits // 8 + values // group * 2 * scale_bytes


HEAD = "output.weight"
EMBEDDING = "token_embd.weight"


def wide_scaled(header: GGUFHeader) -> frozenset[str]:
    """The tensor whose float32 scales a converted file keeps where activations are float32
    (the loader's `_in_activation_dtype`): the output head, whose float16 scales would be
    widened afresh in every pass (58 MB a pass for a 151k vocabulary, where float32 ones cost
    29 MB once); the token embedding when it is the head too (no `output.weight`). An
    embedding that is not the head keeps float16 scales and widens only the rows it looks up."""
    return frozenset({HEAD if HEAD in header.tensors else EMBEDDING})


def wide_scales(header: GGUFHeader) -> frozenset[str]:
    """`wide_scaled`'s scales and biases, by GGUF name."""
    return frozenset(
        name.replace(".weight", f".{part}")
        for name in wide_scaled(header)
        for part in ("scales", "biases")
    )


def resident_bytes(header: GGUFHeader, layout: Layout) -> int:
    """The converted weights' bytes in memory, from the header alone (float32 scales in a file
    read through kquants in the exact layout, and for `wide_scaled` in the compact one where
    activations are float32; float16 otherwise, as `mx.load` gives them)."""
    from macspec.models.gguf.layout import activation_dtype

    converted = needs_conversion(header)
    scale_bytes = 4 if converted and layout is Layout.EXACT else 2
    wide = wide_scaled(header) if converted and activation_dtype() == mx.float32 else ()
    return sum(
        tensor_bytes(
            t.qtype,
            int(np.prod(t.shape, dtype=np.int64)),
            t.nbytes,
            4 if t.name in wide else scale_bytes,
            layout,
        )
        for t in header.tensors.values()
    )


def compute_dtype(header: GGUFHeader, layout: Layout) -> str:
    """The dtype the converted model computes in (and its KV cache holds): float32 for a file
    read through kquants in the exact layout (float32 scales); a compact one's
    `activation_dtype`; else the one float type of its tensors and of `mx.load`'s float16
    scales, float32 when they mix (MLX promotes: llama.cpp's F32 norms make most files compute
    in float32)."""
    from macspec.models.gguf.layout import activation_dtype

    if needs_conversion(header):
        if layout is Layout.EXACT:
            return "float32"
        return "float16" if activation_dtype() == mx.float16 else "float32"
    names = {Q.F32: "float32", Q.F16: "float16", Q.BF16: "bfloat16"}
    dtypes = {names.get(t.qtype, "float16") for t in header.tensors.values()}
    return dtypes.pop() if len(dtypes) == 1 else "float32"


def readable_types() -> list[Q]:
    """Every tensor type macspec reads."""
    return [qtype for qtype in Q if qtype in CONVERTERS or kquants.convertible(qtype)]


def unreadable(header: GGUFHeader) -> list[tuple[str, Q]]:
    """The tensors of a type no converter reads, in file order."""
    readable = readable_types()
    return [(t.name, t.qtype) for t in header.tensors.values() if t.qtype not in readable]


def converter(qtype: Q, kquant_file: bool, layout: Layout, name: str) -> Converter:
    """How a tensor of `qtype` is read: as `mx.load` would in a file of only its types (and, in
    the compact layout, in any file); else (`kquant_file`; floats aside) through kquants in
    `layout`, its errors naming `name`."""
    if qtype in FLOAT_TYPES or (
        qtype in CONVERTERS and (layout is Layout.COMPACT or not kquant_file)
    ):
        return CONVERTERS[qtype]
    options = {"scales_dtype": scales_dtype(layout)}
    if layout is Layout.COMPACT and kquants.affine_bits(qtype) is None and qtype != Q.MXFP4:
        options["requantize_bits"], options["requantize_group"] = requantized(qtype)

    def convert(raw: np.ndarray, shape: tuple[int, ...]) -> dict[str, mx.array]:
        return kquants.convert(qtype, raw, shape, name=name, **options)

    return convert


CHUNK_BYTES = 8 << 20
"""A large tensor is converted this many of its bytes at a time (whole rows): what converting
holds besides the weights stays small."""


def read_tensors(
    header: GGUFHeader,
    layout: Layout,
    progress: Progress | None = None,
    names: Collection[str] | None = None,
) -> dict[str, mx.array]:
    """Every tensor (or those `names` gives), by GGUF name (`blk.0.attn_q.weight`, with
    `.scales`/`.biases` beside a quantized one), evaluated, as the whole file converts them.
    Read tensor by tensor rather than by `mx.load`, which holds the whole file twice while it
    reads and gives BF16 as float16. `progress` hears the tensor bytes read so far after each
    tensor."""
    out: dict[str, mx.array] = {}
    kquant_file = needs_conversion(header)
    tensors = [t for t in header.tensors.values() if names is None or t.name in names]
    total = sum(t.nbytes for t in tensors)
    done = 0
    with ExitStack() as stack:
        files: dict[Path, BinaryIO] = {}  # a split model's parts, each opened once
        for tensor in tensors:
            if tensor.file not in files:
                files[tensor.file] = stack.enter_context(open(tensor.file, "rb"))
            stem = tensor.name.removesuffix(".weight")
            read = _convert(files[tensor.file], tensor, kquant_file, layout)
            for part, value in read.items():
                out[tensor.name if part == "weight" else f"{stem}.{part}"] = value
            done += tensor.nbytes
            if progress is not None:
                progress(header.path.name, done, total)
    return out


def _convert(
    file: BinaryIO, tensor: TensorEntry, kquant_file: bool, layout: Layout
) -> dict[str, mx.array]:
    """One tensor through its converter, a slab of whole rows at a time."""
    rows = tensor.shape[0] if len(tensor.shape) > 1 else 1
    row_bytes = tensor.nbytes // rows
    step = max(1, CHUNK_BYTES // max(1, row_bytes))
    out: dict[str, mx.array] = {}
    file.seek(tensor.start)
    for first in range(0, rows, step):
        count = min(step, rows - first)
        raw = np.frombuffer(file.read(count * row_bytes), np.uint8)
        if raw.size < count * row_bytes:  # cut short since its header was read
            raise MacspecError(f"{file.name}: truncated at tensor {tensor.name}")
        shape = (count, *tensor.shape[1:]) if len(tensor.shape) > 1 else tensor.shape
        where = f"{file.name}: tensor {tensor.name}" + (f" (from row {first})" if first else "")
        slab = converter(tensor.qtype, kquant_file, layout, where)(raw, shape)
        if count == rows:
            out = slab
        else:  # written into the whole tensor in place (its buffer donated to each update)
            for part, value in slab.items():
                if part not in out:
                    out[part] = mx.zeros((rows, *value.shape[1:]), value.dtype)
                out[part][first : first + count] = value
        mx.eval(list(out.values()))
        mx.clear_cache()  # the steps' buffers back to the system, not kept for reuse
    return out
