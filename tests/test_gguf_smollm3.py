"""SmolLM3 from a GGUF file (smollm3): the tiny file of tests/oraclekit.py (the one llama.cpp's
answer is recorded for) skips rope on every 4th layer, as llama.cpp's fixed step does, and
`macspec run --model FILE.gguf` answers it with lookup drafting exactly as without a draft."""

from __future__ import annotations

import json

import pytest
from oraclekit import macspec_model, rebuilt

from macspec.cli import main

MAX_TOKENS = 24
REPEATING = "Say again: the red fox sees the blue bird, the red fox sees the blue bird"


@pytest.fixture(scope="module")
def smollm3(tmp_path_factory):
    folder = tmp_path_factory.mktemp("smollm3")
    return rebuilt("smollm3", folder), folder / "home"


def test_every_fourth_layer_skips_rope(smollm3):
    path, home = smollm3
    layers = macspec_model(path, home).layers
    assert [type(layer.self_attn.rope).__name__ for layer in layers] == [
        "RoPE",
        "RoPE",
        "RoPE",
        "NoPE",
    ]


def run_json(capsys, path, home, *args: str) -> dict:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MACSPEC_HOME", str(home))
        code = main(
            ["run", REPEATING, "--model", str(path), "--max-tokens", str(MAX_TOKENS)]
            + ["--json", *args]
        )
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def test_lookup_drafted_run_is_the_undrafted_one(smollm3, capsys):
    path, home = smollm3
    plain = run_json(capsys, path, home, "--no-draft")
    drafted = run_json(capsys, path, home, "--draft", "lookup")
    assert len(plain["tokens"]) == MAX_TOKENS
    assert drafted["tokens"] == plain["tokens"]
    assert drafted["stats"]["draft_proposed"] > drafted["stats"]["draft_accepted"]
