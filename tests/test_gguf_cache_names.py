"""`macspec cache` names a converted Ollama model by its Ollama name (not its blob's hash), and
`cache clear --gguf --model` takes the names a user knows: an Ollama name in any form, a relative
path, any part of a split model; several entries removed are named. A file read as it is (no
conversion) shows `-` as its converted size."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tiny
from gguf import GGMLQuantizationType as Q
from ggufkit import tiny_gguf, write_gguf
from storekit import LAYER, OllamaStore

from macspec.cli import main
from macspec.models import hub
from macspec.models.gguf.load import load_gguf_model


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("MACSPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "ollama"))
    return tmp_path


def folder(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def load(name: str) -> None:
    load_gguf_model(hub.local_model_path(name))


def listed(capsys) -> list[dict]:
    assert main(["cache", "--json"]) == 0
    return json.loads(capsys.readouterr().out)["gguf"]["files"]


def clear(capsys, model: str) -> str:
    assert main(["cache", "clear", "--gguf", "--model", model]) == 0, capsys.readouterr().err
    return capsys.readouterr().out


@pytest.fixture
def ollama_model(home) -> None:
    """`smollm2:latest` in Ollama's store, its blob a real file named by its hash (as Ollama)."""
    source = tiny_gguf(folder(home / "src"), Q.Q5_0)
    store = OllamaStore(home / "ollama")
    layer = {"mediaType": LAYER + "model", **store.blob(source.read_bytes())}
    store.add("smollm2:latest", extra=[layer])


@pytest.mark.parametrize("form", ["smollm2", "smollm2:latest", "ollama:smollm2"])
def test_an_ollama_model_is_listed_and_cleared_by_its_name(ollama_model, form, capsys):
    load("smollm2")
    assert [entry["name"] for entry in listed(capsys)] == ["smollm2:latest"]
    assert main(["cache"]) == 0
    table = capsys.readouterr().out
    assert "smollm2:latest" in table and "sha256-" not in table
    assert "freed" in clear(capsys, form)
    assert listed(capsys) == []


def test_a_relative_path_is_cleared_and_an_unconverted_file_shows_a_dash(home, capsys, monkeypatch):
    native = tiny_gguf(folder(home / "files"), Q.Q4_0)  # mlx reads Q4_0 as it is: nothing converted
    load(str(native))
    assert main(["cache"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if native.name in line)
    assert [cell.strip() for cell in row.split("│")][2] == "-"
    monkeypatch.chdir(native.parent)
    assert "freed" in clear(capsys, f"./{native.name}")
    assert listed(capsys) == []


def test_any_part_of_a_split_model_clears_it_and_several_removed_are_named(home, capsys):
    model = tiny.random_model(seed=2)
    first = write_gguf(model, tiny.llama_config(model), home / "gem.gguf", split_max_tensors=6)
    parts = sorted(home.glob("gem-0000?-of-*.gguf"))
    assert first == parts[0] and len(parts) >= 2
    load(str(parts[1]))
    assert [entry["name"] for entry in listed(capsys)] == [first.name]
    assert "freed" in clear(capsys, parts[1].name)
    assert listed(capsys) == []
    load(str(first))
    second = tiny_gguf(folder(home / "other"), Q.Q4_0).rename(home / "other" / first.name)
    load(str(second))  # two files of the same name: `--model NAME` removes both, and says so
    said = clear(capsys, first.name)
    assert str(first) in said and str(second) in said
    assert listed(capsys) == []
