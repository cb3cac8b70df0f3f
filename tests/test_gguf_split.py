"""A GGUF model split into parts as llama.cpp's gguf-split (here gguf-py's writer, with its split
arguments) writes one: any part named loads the whole model, with the unsplit file's logits; its
derived folder covers every part; a missing or foreign part is one line; a store lists the model
once, at its total size."""

from __future__ import annotations

import json
import os
from pathlib import Path

import mlx.core as mx
import pytest
from gguf import GGMLQuantizationType as Q
from ggufkit import write_gguf
from storekit import lmstudio_repo
from test_gguf_files import CONFIGS, PROMPT, random_model

from macspec.cli import main
from macspec.errors import MacspecError
from macspec.models import hub
from macspec.models.gguf.layout import Layout
from macspec.models.gguf.load import CONVERTED
from macspec.models.gguf.split import read_model_header
from macspec.models.loader import load_model

CONFIG = CONFIGS["llama"]  # 21 tensors: 3 parts of at most 8


@pytest.fixture(scope="module")
def model():
    return random_model(CONFIG, seed=3)


def _split(model, folder, kind=Q.F32, name="model.gguf"):
    first = write_gguf(model, CONFIG, folder / name, float_type=kind, split_max_tensors=8)
    return sorted(folder.glob(f"{first.name.split('-00001-')[0]}-0000?-of-00003.gguf"))


def _logits(path):
    return load_model(hub.local_model_path(str(path)), "model")[0](mx.array([PROMPT]))


@pytest.mark.parametrize(
    "kind", [Q.Q8_0, Q.Q5_0], ids=["Q8_0", "Q5_0"]
)  # mx.load's type; one converted and cached
def test_any_part_loads_the_whole_model_as_the_unsplit_file(kind, model, tmp_path):
    whole = write_gguf(model, CONFIG, tmp_path / "whole.gguf", float_type=kind)
    parts = _split(model, tmp_path, kind)
    assert [p.name for p in parts] == [f"model-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    assert all(read_model_header(p).path == parts[0] for p in parts)
    expected = _logits(whole)
    for part in parts:
        assert mx.array_equal(_logits(part), expected), part.name
    folder = hub.local_model_path(str(parts[1]))
    assert folder == hub.local_model_path(str(parts[0]))  # one derived folder, whichever named
    assert json.loads((folder / "config.json").read_text())["gguf"]["file"] == str(parts[0])
    assert (folder / CONVERTED[Layout.COMPACT]).is_file() == (kind == Q.Q5_0)
    header = read_model_header(parts[0])
    assert header.size == sum(p.stat().st_size for p in parts)
    assert {t.file for t in header.tensors.values()} == set(parts)


def test_the_identity_covers_every_part(model, tmp_path):
    parts = _split(model, tmp_path)
    folder = hub.local_model_path(str(parts[0]))
    before = read_model_header(parts[0]).identity()
    with open(parts[1], "r+b") as file:  # a weight in the middle part changed
        file.seek(-4, os.SEEK_END)
        file.write(b"\x00\x00\x80\x3f")
    assert read_model_header(parts[0]).identity() != before
    with pytest.raises(MacspecError, match="changed since it was read"):
        load_model(folder, "model")
    assert hub.local_model_path(str(parts[2])) != folder


def test_a_missing_or_foreign_part_is_one_line(model, tmp_path, capsys):
    parts = _split(model, tmp_path)
    (tmp_path / "other").mkdir()
    other = _split(random_model(CONFIG, seed=4), tmp_path / "other")
    parts[2].unlink()
    for named in parts[:2]:
        assert main(["run", "hi", "--model", str(named)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{parts[2]}: missing, part 3 of 3" in err, err
    os.replace(other[1], parts[2])  # the third name holds another model's second part
    assert main(["run", "hi", "--model", str(parts[0])]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{parts[2]}: not part 3 of 3" in err, err
    lone = tmp_path / "renamed.gguf"
    os.replace(parts[1], lone)  # a part under another name: the others cannot be found
    assert main(["run", "hi", "--model", str(lone)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "part 2 of 3 of a split model" in err, err


def test_a_store_lists_a_split_model_once(model, capsys, monkeypatch):
    monkeypatch.setattr(hub, "gguf_model_path", lambda path: path)  # names, not loading
    folder = lmstudio_repo(Path(os.environ["HOME"]), "someone", "split-GGUF")
    parts = _split(model, folder, name="split-F32.gguf")
    assert main(["models", "--local", "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert [entry["name"] for entry in found] == ["lmstudio:someone/split-GGUF"]
    assert found[0]["path"] == str(parts[0])
    assert found[0]["size_bytes"] == sum(p.stat().st_size for p in parts)
    parts[0].unlink()  # the first part gone: listed once, as unreadable, saying which
    assert main(["models", "--local", "--json"]) == 0
    (entry,) = json.loads(capsys.readouterr().out)
    assert not entry["readable"] and "missing, part 1 of 3" in entry["error"]
