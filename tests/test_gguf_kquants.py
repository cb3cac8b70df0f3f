"""GGUF blocks into MLX affine weights: exact types equal gguf's dequantization bit for bit (random
blocks and Gemma 3 270M Q4_K_M's own tensors), the others within float16's rounding, and bad
data is one clean error."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGUFWriter, quants
from gguf import GGMLQuantizationType as Q
from kquantkit import Tensor, gemma_q4_k_m, mapped_tensors

from macspec.errors import MacspecError
from macspec.models.gguf import kquants
from macspec.models.gguf.header import read_header
from macspec.models.gguf.layout import Layout
from macspec.models.gguf.tensors import read_tensors

HALF_FIELDS = {
    Q.Q4_0: [0],
    Q.Q4_1: [0, 2],
    Q.Q5_0: [0],
    Q.Q5_1: [0, 2],
    Q.Q8_0: [0],
    Q.Q4_K: [0, 2],
    Q.Q5_K: [0, 2],
    Q.Q6_K: [-2],
    Q.Q3_K: [-2],
    Q.Q2_K: [-4, -2],
    Q.IQ4_NL: [0],
    Q.IQ4_XS: [0],
}
"""Byte offsets of each type's fp16 scales (d, dmin), set to finite values in random blocks."""

EDGE_HALVES = np.array([0.0, -0.0, 6e-8, -3e-5, 1e-3, -0.02, 0.5, 65504.0], np.float16)
"""Zero, signed zero, subnormals, the largest half: the scales where rounding would show."""


def random_blocks(qtype: Q, rows: int, cols: int, seed: int, edges: bool = True) -> np.ndarray:
    """Random bytes in every field (any bit pattern is a valid q or 6-bit scale) with finite
    fp16 scales, edge values among them; [rows, bytes per row] as GGUFReader maps it."""
    rng = np.random.default_rng(seed)
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    count = rows * cols // block_size
    blocks = rng.integers(0, 256, size=(count, type_size), dtype=np.uint8)
    for offset in HALF_FIELDS[qtype]:
        halves = (rng.standard_normal(count) * 0.02).astype(np.float16)
        if edges:
            halves[: len(EDGE_HALVES)] = EDGE_HALVES[rng.permutation(len(EDGE_HALVES))]
        start = offset % type_size
        blocks[:, start : start + 2] = halves.view(np.uint8).reshape(count, 2)
    return blocks.reshape(rows, -1)


def as_floats(converted: dict[str, mx.array], qtype: Q, requantize_bits=None) -> np.ndarray:
    """The converted tensor as float32, through MLX's own dequantization."""
    if "scales" not in converted:
        return np.array(converted["weight"].astype(mx.float32))
    bits = kquants.affine_bits(qtype, requantize_bits)
    weight, scales, biases = converted["weight"], converted["scales"], converted["biases"]
    return np.array(mx.dequantize(weight, scales, biases, group_size=32, bits=bits))


@pytest.fixture(scope="module")
def gemma(tmp_path_factory) -> list[Tensor]:
    """Gemma 3 270M Q4_K_M's tensors, its four installed parts concatenated once."""
    return mapped_tensors(gemma_q4_k_m(tmp_path_factory.mktemp("gemma")))


def rows_of(tensor: Tensor, limit: int) -> tuple[np.ndarray, tuple[int, ...]]:
    """At most `limit` rows of a GGUF tensor (rows are independent) and their shape."""
    raw = tensor.data[:limit]
    return raw, (len(raw), tensor.shape[-1])


@pytest.mark.parametrize("qtype", sorted(kquants.EXACT, key=int), ids=lambda q: q.name)
def test_exact_types_equal_gguf_on_random_blocks(qtype, monkeypatch):
    # small chunks: the conversion runs over several chunks of blocks, as on a big tensor
    monkeypatch.setattr(kquants, "CHUNK_VALUES", 7 * 256)
    raw = random_blocks(qtype, rows=24, cols=512, seed=int(qtype))
    converted = kquants.convert(qtype, raw, (24, 512))

    assert kquants.is_exact(qtype)
    assert converted["weight"].dtype == mx.uint32
    assert converted["scales"].dtype == converted["biases"].dtype == mx.float32
    assert converted["scales"].shape == (24, 512 // 32)
    np.testing.assert_array_equal(as_floats(converted, qtype), quants.dequantize(raw, qtype))


@pytest.mark.parametrize(
    "qtype", [Q.Q6_K, Q.Q3_K, Q.Q2_K, Q.IQ4_NL, Q.IQ4_XS], ids=lambda q: q.name
)
def test_other_types_within_float16_rounding(qtype):
    raw = random_blocks(qtype, rows=8, cols=512, seed=int(qtype), edges=False)
    reference = quants.dequantize(raw, qtype)
    converted = kquants.convert(qtype, raw, (8, 512))

    assert not kquants.is_exact(qtype)
    assert kquants.affine_bits(qtype) is None and set(converted) == {"weight"}
    assert converted["weight"].dtype == mx.float16
    # float16 rounds to nearest: half an ulp, 2**-11 relative, 2**-25 below its normal range
    bound = np.maximum(np.abs(reference) * 2.0**-11, 2.0**-25)
    assert np.all(np.abs(as_floats(converted, qtype) - reference) <= bound)


def test_values_beyond_float16_keep_float32():
    raw = random_blocks(Q.Q6_K, rows=8, cols=512, seed=2)  # d = 65504 in some block
    reference = quants.dequantize(raw, Q.Q6_K)
    converted = kquants.convert(Q.Q6_K, raw, (8, 512))

    assert np.abs(reference).max() > np.finfo(np.float16).max
    assert converted["weight"].dtype == mx.float32
    np.testing.assert_array_equal(as_floats(converted, Q.Q6_K), reference)


def test_requantized_to_8_bits_within_one_step():
    raw = random_blocks(Q.Q6_K, rows=8, cols=512, seed=3, edges=False)
    reference = quants.dequantize(raw, Q.Q6_K)
    converted = kquants.convert(Q.Q6_K, raw, (8, 512), requantize_bits=8)

    assert kquants.affine_bits(Q.Q6_K, 8) == 8 and converted["weight"].shape == (8, 128)
    groups = reference.reshape(8, 16, 32)
    step = (groups.max(axis=-1) - groups.min(axis=-1)) / 255
    error = np.abs(as_floats(converted, Q.Q6_K, 8) - reference).reshape(8, 16, 32)
    # one step, not half: mx.quantize itself moves the grid (its bias) to hold zero exactly
    assert np.all(error <= step[..., None] * (1 + 1e-3))


def test_gemma_tensors_equal_gguf(gemma):
    types_seen = set()
    for tensor in gemma:
        qtype = tensor.qtype
        if qtype == Q.F32:
            continue
        types_seen.add(qtype)
        raw, shape = rows_of(tensor, 512)
        reference = quants.dequantize(raw, qtype)
        got = as_floats(kquants.convert(qtype, raw, shape, name=tensor.name), qtype)
        if kquants.is_exact(qtype):
            np.testing.assert_array_equal(got, reference, err_msg=tensor.name)
        else:
            bound = np.maximum(np.abs(reference) * 2.0**-11, 2.0**-25)
            assert np.all(np.abs(got - reference) <= bound), tensor.name
    assert types_seen == {Q.Q4_K, Q.Q5_0, Q.Q8_0, Q.Q6_K}


def test_gemma_q4_k_matmul_matches_the_float_matmul(gemma):
    tensor = next(t for t in gemma if t.name == "blk.3.attn_output.weight")
    shape = tensor.shape
    assert tensor.qtype == Q.Q4_K
    converted = kquants.convert(tensor.qtype, tensor.data, shape)
    weight = mx.array(quants.dequantize(tensor.data, tensor.qtype))
    x = mx.random.normal((4, shape[1]), key=mx.random.key(0))
    fast = mx.quantized_matmul(
        x, converted["weight"], converted["scales"], converted["biases"], group_size=32, bits=4
    )
    assert mx.allclose(fast, x @ weight.T, rtol=1e-4, atol=1e-4)


def test_float16_scales_round_k_quant_scales(gemma):
    """Why the scales are float32: float16 cannot hold d*sc (17 significant bits)."""
    tensor = next(t for t in gemma if t.qtype == Q.Q4_K)
    raw, shape = rows_of(tensor, 256)
    half = kquants.convert(Q.Q4_K, raw, shape, scales_dtype=mx.float16)
    assert not np.array_equal(as_floats(half, Q.Q4_K), quants.dequantize(raw, Q.Q4_K))


def one_line_error(*args, **kwargs) -> str:
    with pytest.raises(MacspecError) as caught:
        kquants.convert(*args, **kwargs)
    assert "\n" not in str(caught.value)
    return str(caught.value)


def test_short_data_is_one_clean_error():
    raw = random_blocks(Q.Q4_K, rows=4, cols=512, seed=0)
    message = one_line_error(Q.Q4_K, raw.reshape(-1)[:-1], (4, 512), name="blk.0.ffn_up.weight")
    assert "blk.0.ffn_up.weight" in message and "Q4_K" in message and "truncated" in message
    assert "multiple of 256" in one_line_error(Q.Q4_K, raw, (8, 256 + 32))
    assert "bytes" in one_line_error(Q.Q4_K, raw.view(np.float32), (4, 512))


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q5_0, Q.Q6_K], ids=lambda q: q.name)
def test_damaged_block_is_one_clean_error(qtype, monkeypatch):
    monkeypatch.setattr(kquants, "CHUNK_VALUES", 128)
    raw = random_blocks(qtype, rows=8, cols=512, seed=1)
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    blocks = raw.reshape(-1, type_size)
    start = HALF_FIELDS[qtype][0] % type_size
    blocks[9, start : start + 2] = np.array([np.inf], np.float16).view(np.uint8)
    message = one_line_error(qtype, raw, (8, 512), name="blk.2.attn_q.weight")
    assert f"blk.2.attn_q.weight: {qtype.name} block 9 has a non-finite scale" in message


def test_unknown_and_undequantizable_types_are_refused_by_name():
    assert "type 99 is unknown" in one_line_error(99, np.zeros(8, np.uint8), (8,))
    raw = np.zeros((1, GGML_QUANT_SIZES[Q.Q8_K][1]), np.uint8)
    message = one_line_error(Q.Q8_K, raw, (1, 256), name="output.weight")
    assert (
        message == "output.weight: GGUF type Q8_K cannot be converted (gguf cannot dequantize it)"
    )


def test_a_damaged_block_in_a_file_is_one_line_naming_file_tensor_and_block(tmp_path):
    raw = random_blocks(Q.Q4_K, rows=4, cols=512, seed=5)
    raw.reshape(-1, 144)[6, 2:4] = np.array([np.nan], np.float16).view(np.uint8)  # dmin
    path = tmp_path / "damaged.gguf"
    writer = GGUFWriter(path, "llama")
    writer.add_tensor("blk.0.ffn_up.weight", raw, raw_dtype=Q.Q4_K)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(MacspecError) as caught:
        read_tensors(read_header(path), Layout.COMPACT)
    assert str(caught.value) == (
        f"{path}: tensor blk.0.ffn_up.weight: Q4_K block 6 has a non-finite scale (damaged file)"
    )
