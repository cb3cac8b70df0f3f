"""A raw completion's text continues its prompt exactly: the leading space of its first token
is kept (mlx-lm's streaming detokenizers drop it, right for a chat reply only), on `run --raw`,
`/v1/completions` and Ollama's raw `/api/generate`, plain and drafted."""

from __future__ import annotations

import json

import ollama
import pytest
from servekit import DEMO, KEY, client, demo_server

from macspec.cli import main
from macspec.engine.generate.detokenize import answer_detokenizer
from macspec.models.loader import load_model

PROMPT = "for x in"  # the demo target continues it with ' y', a token that starts with a space


@pytest.fixture(scope="module")
def tokenizer():
    return load_model(DEMO / "target", "model")[1]


def streamed(tokenizer, ids: list[int], continuation: bool) -> str:
    detokenizer = answer_detokenizer(tokenizer, continuation)
    for token in ids:
        detokenizer.add_token(token)
    detokenizer.finalize()
    return detokenizer.text


def test_a_continuation_keeps_its_leading_space_and_a_reply_does_not(tokenizer):
    ids = tokenizer.encode(" the cat", add_special_tokens=False)
    assert streamed(tokenizer, ids, continuation=True) == " the cat"
    assert streamed(tokenizer, ids, continuation=False) == "the cat"  # as mlx-lm shows replies
    assert streamed(tokenizer, ids, continuation=True) == tokenizer.decode(ids)


@pytest.mark.parametrize(
    "drafting", [["--no-draft"], ["-k", "4"], ["--draft", "suffix", "-k", "4"]]
)
def test_run_raw_text_is_the_decoded_continuation(capsys, tokenizer, drafting):
    assert main(["run", "--raw", "--json", "--max-tokens", "6", *drafting, PROMPT]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["text"].startswith(" ")
    assert record["text"] == tokenizer.decode(record["tokens"])


def test_served_raw_completions_keep_the_space(tokenizer):
    with demo_server("4", 6) as server:
        completion = client(server).completions.create(model="tiny", prompt=PROMPT, max_tokens=6)
        text = completion.choices[0].text
        assert text.startswith(" ") and text == tokenizer.decode(tokenizer.encode(text))
        ollama_api = ollama.Client(
            host=server.base_url.removesuffix("/v1"), headers={"Authorization": f"Bearer {KEY}"}
        )
        reply = ollama_api.generate(
            model="tiny", prompt=PROMPT, raw=True, options={"num_predict": 6}
        )
        assert reply.response == text
