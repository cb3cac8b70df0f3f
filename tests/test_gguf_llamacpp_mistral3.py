"""Mistral Small 3.1/3.2 and Devstral as convert_hf_to_gguf.py writes them (Mistral3Model's text
model is a LlamaModel under the name `mistral3`: Q and K rows permuted, `vocab_size` and
`rope.dimension_count` keys). The tiny file is the llama one renamed, and llama.cpp gives it
the llama file's answer (tests/fixtures/llamacpp/mistral3.json). macspec refuses the
architecture in one line for now; once it reads it (as llama), "mistral3" joins SUPPORTED in
tests/test_gguf_llamacpp.py and this file goes."""

from __future__ import annotations

import pytest
from oraclekit import fixture, macspec_steps, rebuilt

from macspec.errors import MacspecError


def test_llamacpp_answers_mistral3_as_llama():
    assert fixture("mistral3")["prompts"] == fixture("llama")["prompts"]


def test_mistral3_is_refused_in_one_line_naming_it(tmp_path):
    path = rebuilt("mistral3", tmp_path)
    with pytest.raises(MacspecError, match=r"architecture 'mistral3' is not supported"):
        macspec_steps(path, tmp_path / "home", [[1]], 1)
