"""macspec's rebuilt byte-level tokenizer splits text as llama.cpp does for the file's
`tokenizer.ggml.pre` (macspec/models/gguf/pretokenizers.py): Qwen3's and Llama 3's vocabularies
under several pre names encode tests/pretokkit.py's texts to the ids llama.cpp's llama-tokenize
gave (tests/fixtures/llamacpp/pretokenizers.json, scripts/capture/llamacpp_pretokenizers.py)."""

from __future__ import annotations

import json

import pytest
from pretokkit import CASES, FIXTURE, TEXTS, VOCABULARIES, vocabulary_gguf
from tokenizers import Tokenizer

from macspec.models.gguf.header import read_header
from macspec.models.gguf.pretokenizers import SPLITS_BY_PRE, llamacpp_pre_tokenizer
from macspec.models.gguf.tokenizer import write_tokenizer

RECORDED = json.loads(FIXTURE.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def gguf_of(tmp_path_factory):
    """vocabulary -> one GGUF with it (the pre name is set per test on its header)."""
    folder = tmp_path_factory.mktemp("vocabularies")
    return {name: vocabulary_gguf(folder / name, name, "default") for name in VOCABULARIES}


def derived_tokenizer(gguf, pre: str, folder, says_bos: bool = True) -> Tokenizer:
    """macspec's tokenizer.json for the file, as if it named `pre` (and, unless `says_bos`, as
    if it did not say whether to add BOS)."""
    header = read_header(gguf)
    header.metadata["tokenizer.ggml.pre"] = pre
    if not says_bos:
        del header.metadata["tokenizer.ggml.add_bos_token"]
    write_tokenizer(header, folder)
    return Tokenizer.from_file(str(folder / "tokenizer.json"))


def test_the_fixture_holds_every_case_and_text():
    assert RECORDED["texts"] == TEXTS
    assert sorted(RECORDED["ids"]) == sorted(f"{vocabulary}/{pre}" for vocabulary, pre in CASES)


@pytest.mark.parametrize(("vocabulary", "pre"), CASES, ids=[f"{v}/{p}" for v, p in CASES])
def test_ids_are_llamacpps_for_the_pre_name(vocabulary, pre, gguf_of, tmp_path):
    tokenizer = derived_tokenizer(gguf_of[vocabulary], pre, tmp_path)
    recorded = RECORDED["ids"][f"{vocabulary}/{pre}"]
    for text, expected in zip(TEXTS, recorded, strict=True):
        assert tokenizer.encode(text, add_special_tokens=False).ids == expected, text


def test_refact_splits_every_digit_alone_where_merges_would_join_them(gguf_of, tmp_path):
    """Granite's files name `refact`: llama.cpp isolates each digit before any merge."""
    tokenizer = derived_tokenizer(gguf_of["llama3"], "refact", tmp_path)
    assert tokenizer.encode("12345", add_special_tokens=False).tokens == list("12345")


@pytest.mark.parametrize(("pre", "adds_bos"), [("tekken", True), ("refact", False)])
def test_bos_by_default_follows_llamacpps_pre_names(pre, adds_bos, gguf_of, tmp_path):
    tokenizer = derived_tokenizer(gguf_of["qwen3"], pre, tmp_path, says_bos=False)
    bos = read_header(gguf_of["qwen3"]).metadata["tokenizer.ggml.bos_token_id"]
    assert (tokenizer.encode("hi").ids[0] == bos) is adds_bos


def test_every_table_entry_compiles_and_an_unknown_name_has_none():
    assert all(llamacpp_pre_tokenizer(pre) is not None for pre in SPLITS_BY_PRE)
    assert llamacpp_pre_tokenizer("no-such-pre") is None
    assert llamacpp_pre_tokenizer(None) is None
