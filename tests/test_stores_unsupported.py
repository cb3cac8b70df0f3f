"""A GGUF of an architecture macspec does not read is listed as a row that says so, in the words
`run` gives, its metadata kept; it never drafts (`--draft-model auto`) and is never served by the
pool. Tiny GGUF files in fake stores under tmp."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from storekit import OllamaStore, lmstudio_repo, tiny_gguf

from macspec.cli import main
from macspec.errors import MacspecError
from macspec.models.catalog import resolve_models
from macspec.models.gguf.archs import ARCHITECTURES
from macspec.serve.servable import servable_models

VOCAB = ["<s>", "</s>", "a", "b", "ab", "ba"]


def why(arch: str) -> str:
    return (
        f"architecture '{arch}' is not supported for GGUF files "
        f"(supported: {', '.join(ARCHITECTURES)})"
    )


@pytest.fixture
def store(tmp_path: Path) -> OllamaStore:
    """A llama target, and two smaller files of its tokenizer whose architectures macspec does
    not read: an Ollama blob and an LM Studio file."""
    user = Path(os.environ["HOME"])
    store = OllamaStore(user / ".ollama" / "models")
    store.add("big:8b", tiny_gguf(tmp_path / "big.gguf", tokens=VOCAB, rows=4000))
    store.add("mamba:1b", tiny_gguf(tmp_path / "mamba.gguf", arch="mamba", tokens=VOCAB))
    folder = lmstudio_repo(user, "someone", "Rwkv-GGUF")
    tiny_gguf(folder / "rwkv-f32.gguf", arch="rwkv6", tokens=VOCAB, rows=16)
    return store


def listing(capsys) -> dict[str, dict]:
    assert main(["models", "--local", "--json"]) == 0
    return {entry["name"]: entry for entry in json.loads(capsys.readouterr().out)}


@pytest.mark.usefixtures("gguf_as_files")
def test_the_json_row_says_why_and_keeps_the_metadata(capsys, store):
    found = listing(capsys)
    mamba, rwkv = found["mamba:1b"], found["lmstudio:someone/Rwkv-GGUF"]
    assert mamba["error"] == f"mamba:1b: {why('mamba')}"
    assert rwkv["error"] == f"lmstudio:someone/Rwkv-GGUF: {why('rwkv6')}"
    for entry in (mamba, rwkv):
        assert entry["readable"] and not entry["runnable"]
        assert entry["format"] == "gguf" and entry["size_bytes"] > 0
    assert (mamba["architecture"], mamba["drafts"]) == ("mamba", [])
    assert found["big:8b"]["runnable"] and found["big:8b"]["drafts"] == []  # never a draft


@pytest.mark.usefixtures("gguf_as_files")
def test_the_table_says_unsupported(capsys, store):
    assert main(["models", "--local"]) == 0
    out = capsys.readouterr().out
    assert f"unsupported mamba:1b: {why('mamba')}" in out
    assert f"unsupported lmstudio:someone/Rwkv-GGUF: {why('rwkv6')}" in out
    assert "unreadable" not in out and "--pair" not in out


@pytest.mark.usefixtures("gguf_as_files")
def test_draft_model_auto_never_takes_it(store):
    with pytest.raises(MacspecError, match="no model on this Mac shares big:8b's tokenizer"):
        resolve_models(None, "big:8b", "auto")


@pytest.mark.parametrize("draft", [[], ["--draft-model", "auto"]])
def test_run_says_the_same_words(capsys, store, draft):
    assert main(["run", "--model", "mamba:1b", *draft, "--max-tokens", "1", "hi"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(why("mamba")) and len(err.splitlines()) == 1


@pytest.mark.usefixtures("gguf_as_files")
def test_draft_model_auto_for_it_says_why_it_cannot_run(store):
    """Not that no draft shares its tokenizer: the reason it cannot run at all."""
    with pytest.raises(MacspecError) as error:
        resolve_models(None, "mamba:1b", "auto")
    assert str(error.value) == f"mamba:1b: {why('mamba')}"


def test_the_pool_does_not_serve_it(store):
    names = {servable.name for servable in servable_models()}
    assert "big:8b" in names
    assert "mamba:1b" not in names and "lmstudio:someone/Rwkv-GGUF" not in names
