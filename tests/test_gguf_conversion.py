"""What loading a GGUF file that must be converted reports: one line on its first load naming
the exact and the float16 tensors (and the same in --json), the converted size estimated from
the header alone (a model that will not fit refused before any weight is read), a progress bar
on a terminal while it converts. Tiny files written with gguf's writer (Q5_0: read through the
converter)."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFWriter
from ggufkit import tiny_gguf

from macspec.cli import main
from macspec.cli.gguf_notes import conversion_line, gguf_loading
from macspec.models import hub, memory
from macspec.models.gguf import load
from macspec.models.gguf.header import read_header
from macspec.models.gguf.layout import Layout, activation_dtype
from macspec.models.gguf.load import load_gguf_model
from macspec.models.gguf.report import Conversion, watch_loads
from macspec.models.gguf.tensors import (
    needs_conversion,
    read_tensors,
    resident_bytes,
    wide_scales,
)
from macspec.text import byte_size


def run_json(capsys, path: Path) -> tuple[dict, str]:
    args = ["run", "--model", str(path), "--raw", "--max-tokens", "2", "--no-draft", "--json"]
    code = main([*args, "--disk-cache-gb", "0", "Hello"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out), err


def test_first_load_says_which_tensors_are_exact_once(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MACSPEC_HOME", str(tmp_path / "home"))
    path = tiny_gguf(tmp_path)
    header = read_header(path)
    quantized = sum(t.qtype == Q.Q5_0 for t in header.tensors.values())
    floats = len(header.tensors) - quantized
    assert quantized and floats

    first, err = run_json(capsys, path)
    resident = resident_bytes(header, Layout.COMPACT)
    sizes = f"compact: {byte_size(resident)} in memory, the file {byte_size(path.stat().st_size)}"
    line = f"macspec: {path.name} ({sizes}): {len(header.tensors)} tensors exact (F32, Q5_0)"
    assert [text for text in err.splitlines() if path.name in text] == [line]
    [record] = first["gguf"]
    assert record["file"] == str(path) and record["converted"] is True
    assert record["exact"] == {"F32": floats, "Q5_0": quantized} and record["inexact"] == {}
    assert record["file_bytes"] == path.stat().st_size
    assert record["resident_bytes"] == resident and record["layout"] == "compact"

    second, err = run_json(capsys, path)  # from the cache: nothing to say on stderr
    assert path.name not in err
    assert second["gguf"] == [{**record, "converted": False}]
    assert second["tokens"] == first["tokens"]


def test_a_plain_model_folder_reports_no_gguf(tmp_path, capsys):
    from tiny import random_model, save_model

    folder = save_model(random_model(seed=1), tmp_path / "plain")
    record, err = run_json(capsys, folder)
    assert record["gguf"] == []


def test_the_line_names_the_float16_types_apart():
    exact, inexact = {"Q8_0": 10, "F32": 109, "Q4_K": 27}, {"Q6_K": 9}
    conversion = Conversion(Path("/m/gemma.gguf"), exact, inexact, True, 10**9, 2 * 10**9, "exact")
    assert conversion_line(conversion) == (
        "gemma.gguf (exact: 2.00 GB in memory, the file 1.00 GB): 146 tensors exact (F32, Q4_K,"
        " Q8_0), 9 not (Q6_K: kept as float16: no exact MLX form)"
    )


def test_the_compact_line_says_what_each_type_lost():
    exact, inexact = {"Q8_0": 10, "F32": 109}, {"Q4_K": 27, "Q6_K": 9}
    conversion = Conversion(Path("/m/gemma.gguf"), exact, inexact, True, 10**9, 10**9, "compact")
    assert conversion_line(conversion) == (
        "gemma.gguf (compact: 1.00 GB in memory, the file 1.00 GB): 119 tensors exact (F32,"
        " Q8_0), 36 not (Q4_K: float16 scales; Q6_K: requantized)"
    )


def random_blocks(qtype: Q, rows: int, cols: int, seed: int) -> np.ndarray:
    """Valid blocks of `qtype`: random bytes with every fp16 scale set to a small finite one."""
    from gguf.constants import GGML_QUANT_SIZES

    block_values, block_bytes = GGML_QUANT_SIZES[qtype]
    raw = np.random.default_rng(seed).integers(0, 256, (rows, cols // block_values * block_bytes))
    raw = raw.astype(np.uint8)
    blocks = raw.reshape(-1, block_bytes)
    scale = np.array([0.01], np.float16).view(np.uint8)
    if qtype == Q.Q6_K:  # d is the last 2 bytes
        blocks[:, -2:] = scale
    else:  # Q4_K: d, dmin at the start
        blocks[:, 0:2] = scale
        blocks[:, 2:4] = scale
    return raw


def k_quant_file(path: Path) -> Path:
    writer = GGUFWriter(path, "llama")
    writer.add_tensor("blk.0.ffn_up.weight", random_blocks(Q.Q4_K, 8, 512, 1), raw_dtype=Q.Q4_K)
    writer.add_tensor("blk.0.ffn_down.weight", random_blocks(Q.Q6_K, 4, 256, 2), raw_dtype=Q.Q6_K)
    writer.add_tensor("blk.0.attn_norm.weight", np.ones(512, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("layout", list(Layout))
@pytest.mark.parametrize("kind", ["q5_0", "q4_0", "k-quants"])
def test_the_resident_size_from_the_header_is_the_converted_tensors_bytes(tmp_path, kind, layout):
    if kind == "k-quants":
        path = k_quant_file(tmp_path / "k.gguf")
    else:
        path = tiny_gguf(tmp_path, Q[kind.upper()])
    header = read_header(path)
    held = {name: value.nbytes for name, value in read_tensors(header, layout).items()}
    if layout is Layout.COMPACT and needs_conversion(header) and activation_dtype() == mx.float32:
        # the loader widens a converted file's head's scales (or a tied embedding's) on a CPU
        for name in wide_scales(header) & held.keys():
            held[name] *= 2
    assert resident_bytes(header, layout) == sum(held.values())


def test_progress_is_heard_on_the_first_conversion_only(tmp_path, monkeypatch):
    monkeypatch.setenv("MACSPEC_HOME", str(tmp_path / "home"))
    path = tiny_gguf(tmp_path)
    folder = hub.local_model_path(str(path))
    heard: list[tuple[str, int, int]] = []
    with watch_loads(lambda *step: heard.append(step)) as loaded:
        load_gguf_model(folder)
    total = sum(t.nbytes for t in read_header(path).tensors.values())
    assert len(heard) == len(read_header(path).tensors)
    assert heard[-1] == (path.name, total, total)
    assert [done for _, done, _ in heard] == sorted({done for _, done, _ in heard})
    assert [c.converted for c in loaded] == [True]
    heard.clear()
    with watch_loads(lambda *step: heard.append(step)) as loaded:
        load_gguf_model(folder)  # from converted.safetensors
    assert heard == [] and [c.converted for c in loaded] == [False]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("terminal", [True, False], ids=["terminal", "pipe"])
def test_the_bar_is_drawn_on_a_terminal_only(tmp_path, monkeypatch, terminal):
    monkeypatch.setenv("MACSPEC_HOME", str(tmp_path / "home"))
    path = tiny_gguf(tmp_path)
    folder = hub.local_model_path(str(path))
    for which in ("first", "cached"):
        err = Terminal() if terminal else io.StringIO()
        monkeypatch.setattr(sys, "stderr", err)
        with gguf_loading():
            load_gguf_model(folder)
        drawn = f"converting {path.name}" in err.getvalue()
        assert drawn == (terminal and which == "first"), which
        # Once every tensor is converted, the bar says what the wait left is for.
        writing = f"{path.name}: writing the converted cache" in err.getvalue()
        assert writing == drawn, which
        said = f"macspec: {path.name} (compact: " in err.getvalue()
        assert said == (which == "first")


@pytest.mark.parametrize("spare", [-1, 0], ids=["one-byte-short", "just-fits"])
def test_a_model_that_will_not_fit_is_refused_before_any_weight_is_read(
    tmp_path, capsys, monkeypatch, spare
):
    monkeypatch.setenv("MACSPEC_HOME", str(tmp_path / "home"))
    path = tiny_gguf(tmp_path)
    need = resident_bytes(read_header(path), Layout.COMPACT)
    monkeypatch.setattr(memory, "usable_memory_bytes", lambda: need + spare)
    if spare < 0:  # not one tensor read, nothing cached

        def unread(*args, **kwargs):
            raise AssertionError("weights read")

        monkeypatch.setattr(load, "read_tensors", unread)
    args = ["run", "--model", str(path), "--raw", "--max-tokens", "1", "--no-draft", "Hi"]
    code = main([*args, "--disk-cache-gb", "0"])
    err = capsys.readouterr().err
    if spare == 0:
        assert code == 0, err
        return
    assert code == 2 and err.count("\n") == 1
    assert err == (
        f"macspec: error: {path}: its weights take {need / 1e9:.2f} GB in memory once "
        f"converted (the file {path.stat().st_size / 1e9:.2f} GB), more than the "
        f"{(need - 1) / 1e9:.2f} GB this machine gives a model; pick a smaller model or "
        "quantization\n"
    )
    assert not list((tmp_path / "home" / "gguf").glob("*/*.safetensors"))


def test_bench_json_names_the_converted_file(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MACSPEC_HOME", str(tmp_path / "home"))
    path = tiny_gguf(tmp_path)
    args = ["bench", "--model", str(path), "--quick", "--max-tokens", "2", "--draft", "lookup"]
    assert main([*args, "--json"]) == 0
    out, err = capsys.readouterr()
    [record] = json.loads(out)["models"]["gguf"]
    assert record["file"] == str(path) and record["converted"] is True
    assert (
        f"{len(read_header(path).tensors)} tensors exact (F32, Q5_0)" in err
        and f"macspec: {path.name} (compact: " in err
    )
