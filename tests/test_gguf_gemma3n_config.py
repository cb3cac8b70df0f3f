"""gemma3n's config from GGUF metadata beyond llama.cpp's converter: the keys Ollama's
convert_gemma3n.go writes under other names, per-layer feed-forward widths, and the files
macspec cannot answer as llama.cpp does, each one line."""

from __future__ import annotations

from dataclasses import replace

import pytest
from oraclekit import rebuilt

from macspec.errors import MacspecError
from macspec.models.gguf.archs.gemma3n import Gemma3n
from macspec.models.gguf.header import read_header


@pytest.fixture(scope="module")
def header(tmp_path_factory):
    return read_header(rebuilt("gemma3n", tmp_path_factory.mktemp("gemma3n")))


def with_keys(header, drop=(), **keys):
    meta = {k: v for k, v in header.metadata.items() if k not in drop}
    meta.update({f"gemma3n.{k.replace('__', '.')}": v for k, v in keys.items()})
    return replace(header, metadata=meta)


def test_ollamas_key_names_read_as_llamacpps(header):
    ollama = with_keys(
        header,
        drop=("gemma3n.attention.key_length", "gemma3n.rope.freq_base_swa"),
        head_dim=16,
        rope__freq_base_local=5_000.0,
        feed_forward_length=[64] * 25,
    )
    text = Gemma3n().config(ollama)["text_config"]
    assert (text["head_dim"], text["rope_local_base_freq"], text["intermediate_size"]) == (
        16,
        5_000.0,
        64,
    )
    assert Gemma3n().config(header)["text_config"]["rope_local_base_freq"] == 10_000.0


def test_per_layer_widths_stay_per_layer(header):
    widths = [64] * 20 + [128] * 5
    text = Gemma3n().config(with_keys(header, feed_forward_length=widths))["text_config"]
    assert text["intermediate_size"] == widths


def test_layers_18_and_19_must_be_local_then_global(header):
    pattern = [True] * 25
    pattern[18], pattern[4] = False, False
    with pytest.raises(MacspecError, match="layers 18-19 not local then global"):
        Gemma3n().config(with_keys(header, attention__sliding_window_pattern=pattern))


def test_an_output_matrix_is_one_line(header):
    tensors = {**header.tensors, "output.weight": header.tensors["token_embd.weight"]}
    with pytest.raises(MacspecError, match="its own output matrix"):
        Gemma3n().config(replace(header, tensors=tensors))
