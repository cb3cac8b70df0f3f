"""`macspec models --local` counts a GGUF's weights as `run` does: at their size once converted
(`tensors.resident_bytes`), not the file's, so the listing never says a model fits that `run`
then refuses for memory."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as Q
from ggufkit import tiny_gguf
from storekit import OllamaStore

from macspec.cli import main
from macspec.errors import MacspecError
from macspec.models import hub, memory
from macspec.models.gguf import layout
from macspec.models.gguf.layout import Layout
from macspec.models.gguf.load import CONVERTED, check_memory, load_gguf_model
from macspec.models.gguf.split import read_model_header
from macspec.models.gguf.tensors import resident_bytes
from macspec.models.stores.describe import describe_gguf
from macspec.models.stores.listing import local_models


def test_the_listing_and_the_refusal_count_the_same_converted_weights(tmp_path: Path, monkeypatch):
    # Q5_0 is read through kquants as K-quants are: in the exact layout, float32 scales, more
    # than the file holds
    monkeypatch.setattr(layout, "_default", Layout.EXACT)
    path = tiny_gguf(tmp_path, Q.Q5_0)
    header = read_model_header(path, strings=False)
    converted = resident_bytes(header, Layout.EXACT)
    assert converted > header.size
    listed = describe_gguf(path)
    assert listed.size_bytes == header.size  # the size column is still the file's
    assert listed.memory.weights_bytes == converted
    kv = listed.memory.kv_cache_bytes
    # a machine whose memory the file's bytes plus the KV cache fit, the converted ones not
    limit = converted + kv - 1
    assert header.size + kv <= limit
    monkeypatch.setattr(memory, "usable_memory_bytes", lambda: limit)
    assert describe_gguf(path).memory.fits is False
    monkeypatch.setattr(memory, "usable_memory_bytes", lambda: converted - 1)
    with pytest.raises(MacspecError, match="once converted"):
        check_memory(header, Layout.EXACT)


def test_a_file_whose_tensor_table_is_cut_is_listed_at_its_file_size(tmp_path: Path):
    path = tiny_gguf(tmp_path, Q.Q4_1)
    full = read_model_header(path, strings=False)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[: full.data_start - 8])  # metadata whole, table not
    listed = describe_gguf(cut)
    assert listed.memory.weights_bytes == cut.stat().st_size


def test_the_listing_counts_the_layout_the_environment_asks_for(tmp_path: Path, monkeypatch):
    """MACSPEC_GGUF_LAYOUT=exact makes `run` hold the exact layout: `macspec models` (which has
    no --gguf-layout) counts that layout too, so it never says fits where `run` refuses."""
    path = tiny_gguf(tmp_path, Q.Q5_0)
    header = read_model_header(path, strings=False)
    monkeypatch.setattr(layout, "_default", None)  # no command has set it in this process
    monkeypatch.setenv("MACSPEC_GGUF_LAYOUT", "exact")
    assert describe_gguf(path).memory.weights_bytes == resident_bytes(header, Layout.EXACT)
    monkeypatch.setenv("MACSPEC_GGUF_LAYOUT", "compact")
    assert describe_gguf(path).memory.weights_bytes == resident_bytes(header, Layout.COMPACT)
    layout.set_default_layout("exact")  # a command's flag wins over the environment
    assert describe_gguf(path).memory.weights_bytes == resident_bytes(header, Layout.EXACT)


def test_a_bad_layout_in_the_environment_is_one_line_naming_it(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(layout, "_default", None)
    monkeypatch.setenv("MACSPEC_GGUF_LAYOUT", "fast")
    with pytest.raises(MacspecError, match="MACSPEC_GGUF_LAYOUT must be one of compact, exact"):
        describe_gguf(tiny_gguf(tmp_path, Q.Q5_0))
    with pytest.raises(MacspecError, match="MACSPEC_GGUF_LAYOUT"):  # once, not on every row
        local_models()


def _listed(capsys) -> dict[str, dict]:
    assert main(["models", "--local", "--json"]) == 0
    return {entry["name"]: entry for entry in json.loads(capsys.readouterr().out)}


def test_the_listing_shows_the_converted_copy_on_disk_until_it_is_cleared(tmp_path: Path, capsys):
    """`macspec models` says what a GGUF costs on disk beside its file, as `macspec cache`
    does: nothing before its first run, the kept copy's bytes after, nothing once cleared."""
    store = OllamaStore(Path(os.environ["HOME"]) / ".ollama" / "models")
    store.add("tiny:q5", tiny_gguf(tmp_path, Q.Q5_0))
    assert _listed(capsys)["tiny:q5"]["converted_bytes"] == 0
    folder = hub.local_model_path("tiny:q5")  # the blob's derived folder
    load_gguf_model(folder)
    kept = (folder / CONVERTED[Layout.COMPACT]).stat().st_size
    assert _listed(capsys)["tiny:q5"]["converted_bytes"] == kept > 0
    assert main(["models", "--local"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if "tiny:q5" in line)
    assert row.rstrip(" │").endswith(byte_size_mb(kept))
    assert main(["cache", "clear", "--model", "tiny:q5"]) == 0
    capsys.readouterr()
    assert _listed(capsys)["tiny:q5"]["converted_bytes"] == 0


def byte_size_mb(n: int) -> str:
    return f"{max(n / 1e6, 0.1):.1f} MB"
