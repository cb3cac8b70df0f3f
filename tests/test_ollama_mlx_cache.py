"""`macspec cache` lists the folders derived from Ollama MLX models (config and tokenizer in
`$MACSPEC_HOME/ollama`; the weights stay in the store's blobs) by their Ollama names, and
`cache clear` (all, or `--model NAME`) removes them, never a byte of the store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ollamamlxkit import write_model
from storekit import OllamaStore
from tiny import arch_config, arch_model

from macspec.cli import main
from macspec.models import stores
from macspec.models.home import macspec_home

NAMES = ("tiny:int4", "tiny:int8")


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> OllamaStore:
    """Two MLX models in an Ollama store, neither derived yet."""
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "ollama"))
    monkeypatch.setenv("MACSPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("HOME", str(tmp_path))
    store = OllamaStore(tmp_path / "ollama")
    for name in NAMES:
        model, config = arch_model("qwen3", 0), arch_config("qwen3")
        write_model(store, name, model, config, name.split(":")[1], tmp_path / name)
    return store


def store_files(root: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def derived(capsys) -> dict[str, dict]:
    assert main(["cache", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)["ollama_mlx"]
    assert record["folder"] == str(macspec_home() / "ollama")
    return {entry["name"]: entry for entry in record["files"]}


def derive(name: str) -> Path:
    found = stores.find(name)
    assert found is not None
    return found.path


def test_cache_lists_each_derived_folder_by_its_ollama_name(store, capsys):
    assert derived(capsys) == {}
    folders = {name: derive(name) for name in NAMES}
    found = derived(capsys)
    assert sorted(found) == sorted(NAMES)
    entry = found["tiny:int4"]
    assert Path(entry["folder"]) == folders["tiny:int4"] and entry["file_exists"] is True
    assert entry["file"].endswith("manifests/registry.ollama.ai/library/tiny/int4")
    on_disk = sum(p.stat().st_size for p in folders["tiny:int4"].rglob("*") if p.is_file())
    assert entry["bytes"] == on_disk > 0 and entry["converted_bytes"] == 0
    assert main(["cache"]) == 0
    table = capsys.readouterr().out
    assert "Ollama MLX models (config and tokenizer)" in table and "tiny:int8" in table


@pytest.mark.parametrize("named", ["tiny:int4", "ollama:tiny:int4"])
def test_clear_model_removes_only_its_folder_and_nothing_of_the_store(store, capsys, named):
    folders = {name: derive(name) for name in NAMES}
    before = store_files(store.root)
    assert main(["cache", "clear", "--gguf", "--model", named]) == 0
    assert "freed" in capsys.readouterr().out
    assert not folders["tiny:int4"].exists() and folders["tiny:int8"].is_dir()
    assert main(["cache", "clear"]) == 0
    assert str(macspec_home() / "ollama") in capsys.readouterr().out
    assert not folders["tiny:int8"].exists() and derived(capsys) == {}
    assert store_files(store.root) == before
    assert derive("tiny:int4").is_dir()  # derived again on its next use


def test_clearing_a_model_not_derived_is_one_line_and_derives_nothing(store, capsys):
    assert main(["cache", "clear", "--gguf", "--model", "tiny:int4"]) == 2
    assert "no model named 'tiny:int4' among derived folders" in capsys.readouterr().err
    assert not (macspec_home() / "ollama").exists()
