"""llama's variants in GGUF files (smollm3: SmolLM3-3B; granite: dense Granite 3.x), on the tiny
files of tests/oraclekit.py (the ones llama.cpp's answers are recorded for): what each reads
beyond llama (smollm3's NoPE layers at llama.cpp's fixed step, granite's multipliers), and
`macspec run --model FILE.gguf` answering each with lookup drafting exactly as without a draft."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from oracle_granite import GRANITE_MULTIPLIERS
from oraclekit import ARCHS, macspec_model, rebuilt

from macspec.cli import main
from macspec.errors import MacspecError
from macspec.models.gguf.archs.granite import Granite
from macspec.models.gguf.archs.smollm3 import SmolLM3
from macspec.models.gguf.header import read_header

MAX_TOKENS = 24
REPEATING = "Say again: the red fox sees the blue bird, the red fox sees the blue bird"


@pytest.fixture(scope="module", params=["smollm3", "granite"])
def tiny(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    return rebuilt(request.param, folder), folder / "home"


@pytest.fixture(scope="module")
def granite_file(tmp_path_factory):
    return rebuilt("granite", tmp_path_factory.mktemp("granite"))


def test_every_fourth_smollm3_layer_skips_rope(tmp_path):
    layers = macspec_model(rebuilt("smollm3", tmp_path), tmp_path / "home").layers
    kinds = [type(layer.self_attn.rope).__name__ for layer in layers]
    assert kinds == ["RoPE", "RoPE", "RoPE", "NoPE"]


def test_a_smollm3_with_rope_freqs_is_one_line(tmp_path):
    header = read_header(rebuilt("smollm3", tmp_path))
    scaled = replace(header, tensors={**header.tensors, "rope_freqs.weight": None})
    with pytest.raises(MacspecError, match="smollm3 file with rope_freqs is not supported"):
        SmolLM3().config(scaled)


def test_granites_multipliers_are_the_files(granite_file):
    config = Granite().config(read_header(granite_file))
    written = ARCHS["granite"].config  # the checkpoint's, each away from its default
    assert {k: round(config[k], 6) for k in GRANITE_MULTIPLIERS} == {
        k: written[k] for k in GRANITE_MULTIPLIERS
    }


def test_a_granite_without_rope_is_one_line(granite_file):
    header = read_header(granite_file)
    norope = replace(header, metadata={**header.metadata, "granite.rope.scaling.finetuned": False})
    with pytest.raises(MacspecError, match="granite file without rope is not read yet"):
        Granite().config(norope)


def run_json(capsys, path, home, *args: str) -> dict:
    command = ["run", REPEATING, "--model", str(path), "--max-tokens", str(MAX_TOKENS), "--json"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MACSPEC_HOME", str(home))
        code = main([*command, *args])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def test_lookup_drafted_run_is_the_undrafted_one(tiny, capsys):
    path, home = tiny
    plain = run_json(capsys, path, home, "--no-draft")
    drafted = run_json(capsys, path, home, "--draft", "lookup")
    assert len(plain["tokens"]) == MAX_TOKENS
    assert drafted["tokens"] == plain["tokens"]
    assert drafted["stats"]["draft_proposed"] > drafted["stats"]["draft_accepted"]
