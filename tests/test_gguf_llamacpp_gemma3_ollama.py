"""Gemma 3 4B-27B as Ollama's convert_gemma3.go writes it: the text model of tests/oraclekit.py's
gemma3 file (same seed, same tensors) with the vision tower in the same file (`v.` and `mm.`
tensors, `gemma3.vision.*` and `gemma3.mm.tokens_per_image` keys) and without the keys Ollama's
engine defaults (`attention.layer_norm_rms_epsilon`, `rope.freq_base`). llama.cpp refuses such a
file (the fixture records its line); its answer is the one on the plain gemma3 file. macspec
refuses it in one line for now; once it reads the text model, "gemma3-ollama" joins SUPPORTED in
tests/test_gguf_llamacpp.py and this file goes."""

from __future__ import annotations

import pytest
from oraclekit import fixture, macspec_steps, rebuilt

from macspec.errors import MacspecError


def test_llamacpp_refused_ollamas_file_and_answered_on_the_plain_one():
    recorded = fixture("gemma3-ollama")
    assert "layer_norm_rms_epsilon" in recorded["llama.cpp refused it"]
    assert recorded["prompts"] == fixture("gemma3")["prompts"]


def test_ollamas_gemma3_is_refused_in_one_line_naming_the_vision_tensor(tmp_path):
    path = rebuilt("gemma3-ollama", tmp_path)
    with pytest.raises(MacspecError, match=r"does not know in a gemma3 file: v\."):
        macspec_steps(path, tmp_path / "home", [[1]], 1)
