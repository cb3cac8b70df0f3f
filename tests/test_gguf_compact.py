"""The compact GGUF layout (the default): every type converted against gguf's own float32
dequantization within the bound its layout states (the legacy types and MXFP4 bit for bit with
float16 scales; Q4_K and Q5_K within the float16 rounding of their scales; the types without an
affine form within one step of their requantization), its bytes as the header predicts, its
copy on disk written whole, and a GPU's float16 activations."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, quants
from gguf import GGMLQuantizationType as Q
from ggufkit import tiny_gguf
from mlx.utils import tree_flatten
from test_gguf_kquants import random_blocks

from macspec.models import hub
from macspec.models.gguf import kquants, layout
from macspec.models.gguf.header import read_header
from macspec.models.gguf.layout import Layout, requantized
from macspec.models.gguf.load import CONVERTED, load_gguf_model
from macspec.models.gguf.tensors import converter, resident_bytes

ROWS, COLS = 16, 512


def compact(qtype: Q, raw: np.ndarray) -> dict[str, mx.array]:
    """One tensor as a K-quant file in the compact layout converts it."""
    return converter(qtype, True, Layout.COMPACT, "t")(raw.reshape(-1), (ROWS, COLS))


def floats(converted: dict[str, mx.array], bits: int, group: int = 32) -> np.ndarray:
    """MLX's dequantization in float32, as a float32 activation meets the weight."""
    return np.array(
        mx.dequantize(
            converted["weight"],
            converted["scales"].astype(mx.float32),
            converted["biases"].astype(mx.float32),
            group_size=group,
            bits=bits,
        )
    )


@pytest.mark.parametrize("qtype", sorted(kquants.HALF_SCALED, key=int), ids=lambda q: q.name)
def test_legacy_types_are_exact_with_float16_scales(qtype):
    raw = random_blocks(qtype, ROWS, COLS, seed=int(qtype), edges=False)
    converted = compact(qtype, raw)
    assert converted["scales"].dtype == converted["biases"].dtype == mx.float16
    bits = kquants.affine_bits(qtype)
    np.testing.assert_array_equal(floats(converted, bits), quants.dequantize(raw, qtype))


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q5_K], ids=lambda q: q.name)
def test_k_quants_within_the_float16_rounding_of_their_scales(qtype):
    raw = random_blocks(qtype, ROWS, COLS, seed=int(qtype), edges=False)
    converted = compact(qtype, raw)
    exact = kquants.convert(qtype, raw, (ROWS, COLS))  # float32 scales: gguf's bit for bit
    bits = kquants.affine_bits(qtype)
    reference = quants.dequantize(raw, qtype)
    np.testing.assert_array_equal(floats(exact, bits), reference)
    # each group's scale and bias rounded once to float16: half an ulp (2**-11 relative, 2**-25
    # absolute below float16's normal range), the scale's error times q (< 2**bits)
    scale = np.abs(np.array(exact["scales"])).repeat(32, axis=-1)
    bias = np.abs(np.array(exact["biases"])).repeat(32, axis=-1)
    ulp = lambda x: np.maximum(x * 2.0**-11, 2.0**-25)  # noqa: E731
    bound = ulp(scale) * (2**bits - 1) + ulp(bias) + np.abs(reference) * 2.0**-23
    assert np.all(np.abs(floats(converted, bits) - reference) <= bound)
    assert not np.array_equal(floats(converted, bits), reference)  # rounding shows somewhere


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q8_0], ids=lambda q: q.name)
def test_a_scale_beyond_float16_keeps_float32_scales_exactly(qtype):
    raw = random_blocks(qtype, ROWS, COLS, seed=1)  # edge scales: 65504 * sc, -128 * 65504
    converted = compact(qtype, raw)
    assert converted["scales"].dtype == mx.float32
    bits = kquants.affine_bits(qtype)
    np.testing.assert_array_equal(floats(converted, bits), quants.dequantize(raw, qtype))


@pytest.mark.parametrize("qtype", [Q.IQ4_NL, Q.IQ4_XS], ids=lambda q: q.name)
def test_iq4_codebooks_are_an_exact_8_bit_code(qtype):
    """Codebook values are integers spanning 240: value + 128 is the 8-bit code, the group's
    scale d (IQ4_XS: d times its 6-bit sub-block scale), the bias -128 d. IQ4_NL's scale and
    bias are the block's own float16: bit for bit; IQ4_XS's rounded to float16 as Q4_K's."""
    raw = random_blocks(qtype, ROWS, COLS, seed=int(qtype), edges=False)
    converted = compact(qtype, raw)
    assert converted["weight"].shape == (ROWS, COLS * 8 // 32)
    assert converted["scales"].dtype == mx.float16
    reference = quants.dequantize(raw, qtype)
    values = floats(converted, 8).reshape(reference.shape)
    if qtype == Q.IQ4_NL:
        np.testing.assert_array_equal(values, reference)
    else:
        np.testing.assert_allclose(values, reference, rtol=2.0**-10, atol=2.0**-24 * 113)


@pytest.mark.parametrize("qtype", [Q.Q6_K, Q.Q3_K, Q.Q2_K], ids=lambda q: q.name)
def test_types_without_an_affine_form_within_one_step_of_their_requantization(qtype):
    raw = random_blocks(qtype, ROWS, COLS, seed=int(qtype), edges=False)
    converted = compact(qtype, raw)
    bits, group = requantized(qtype)
    assert converted["weight"].shape == (ROWS, COLS * bits // 32)
    assert converted["scales"].dtype == mx.float16
    reference = quants.dequantize(raw, qtype).reshape(ROWS, -1, group)
    step = (reference.max(axis=-1) - reference.min(axis=-1)) / (2**bits - 1)
    scale = np.abs(np.array(converted["scales"], np.float32))
    # one step (mx.quantize moves its grid to hold zero), plus the float16 rounding of the
    # scale times the code and of the bias
    slack = np.maximum(scale * 2.0**-11, 2.0**-25) * 2**bits + np.abs(reference).max() * 2.0**-10
    error = np.abs(floats(converted, bits, group).reshape(reference.shape) - reference)
    assert np.all(error <= (step + slack)[..., None] * (1 + 1e-3))


@pytest.mark.parametrize("kind", list(Layout))
def test_mxfp4_is_mlx_mxfp4_bit_for_bit_in_either_layout(kind):
    rng = np.random.default_rng(4)
    blocks = rng.integers(0, 256, (ROWS * COLS // 32, 17), dtype=np.uint8)
    blocks[:, 0] = rng.integers(100, 140, len(blocks))  # E8M0 exponents near 1.0
    converted = converter(Q.MXFP4, True, kind, "t")(blocks.reshape(-1), (ROWS, COLS))
    assert set(converted) == {"weight", "scales"} and converted["scales"].dtype == mx.uint8
    values = mx.dequantize(
        converted["weight"], converted["scales"], group_size=32, bits=4, mode="mxfp4"
    )
    reference = quants.dequantize(blocks.reshape(ROWS, -1), Q.MXFP4)
    np.testing.assert_array_equal(np.array(values.astype(mx.float32)), reference)
    assert GGML_QUANT_SIZES[Q.MXFP4] == (32, 17)


def test_the_model_holds_the_bytes_the_header_predicts(tmp_path, monkeypatch):
    monkeypatch.setenv("MACSPEC_HOME", str(tmp_path / "home"))
    path = tiny_gguf(tmp_path, Q.Q5_0)
    folder = hub.local_model_path(str(path))
    header = read_header(path)
    for kind in Layout:
        model = load_gguf_model(folder, kind)
        held = sum(value.nbytes for _, value in tree_flatten(model.parameters()))
        assert held == resident_bytes(header, kind), kind
    assert resident_bytes(header, Layout.COMPACT) < resident_bytes(header, Layout.EXACT)


def test_a_copy_cut_short_is_never_read(tmp_path, monkeypatch):
    monkeypatch.setenv("MACSPEC_HOME", str(tmp_path / "home"))
    path = tiny_gguf(tmp_path, Q.Q5_0)
    folder = hub.local_model_path(str(path))
    expected = dict(tree_flatten(load_gguf_model(folder).parameters()))
    (folder / CONVERTED[Layout.COMPACT]).unlink()
    # a write killed mid-way leaves only its temporary name, never the copy's own
    (folder / "compact.999.partial.safetensors").write_bytes(b"\0" * 100)

    def killed(file: str, arrays: dict) -> None:
        with open(file, "wb") as out:
            out.write(b"{half a header")
        raise KeyboardInterrupt

    monkeypatch.setattr(mx, "save_safetensors", killed)
    with pytest.raises(KeyboardInterrupt):
        load_gguf_model(folder)
    assert not (folder / CONVERTED[Layout.COMPACT]).exists()
    monkeypatch.undo()
    monkeypatch.setenv("MACSPEC_HOME", str(tmp_path / "home"))
    again = dict(tree_flatten(load_gguf_model(folder).parameters()))
    assert again.keys() == expected.keys()
    assert all(mx.array_equal(again[name], value) for name, value in expected.items())


def test_a_gpu_computes_in_float16_with_no_float32_weight_left(tmp_path, monkeypatch):
    monkeypatch.setenv("MACSPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(layout, "activation_dtype", lambda: mx.float16)
    path = tiny_gguf(tmp_path, Q.Q5_0)
    model = load_gguf_model(hub.local_model_path(str(path)), Layout.COMPACT)
    dtypes = {value.dtype for _, value in tree_flatten(model.parameters())}
    assert mx.float32 not in dtypes and mx.float16 in dtypes
    assert model(mx.array([[1, 2, 3]])).dtype == mx.float16


def test_a_cpu_holds_the_head_scales_wide_and_widens_only_the_embedding_rows_it_reads(
    tmp_path, monkeypatch
):
    """float32 activations (this CPU): the untied head's scales float32 (no widening per pass),
    the embedding's float16, its looked-up rows float32 and equal to float32 scales' rows."""
    monkeypatch.setenv("MACSPEC_HOME", str(tmp_path / "home"))
    path = tiny_gguf(tmp_path, Q.Q5_0)
    model = load_gguf_model(hub.local_model_path(str(path)), Layout.COMPACT)
    embedding = model.model.embed_tokens
    assert model.lm_head.scales.dtype == mx.float32
    assert embedding.scales.dtype == mx.float16
    ids = mx.array([[0, 5, 17, 200]])
    rows = embedding(ids)
    wide = mx.dequantize(
        embedding.weight[ids],
        embedding.scales[ids].astype(mx.float32),
        embedding.biases[ids].astype(mx.float32),
        embedding.group_size,
        embedding.bits,
    )
    assert rows.dtype == mx.float32
    np.testing.assert_array_equal(np.array(rows), np.array(wide))
    assert model(ids).dtype == mx.float32
