"""`macspec serve`'s default drafter (`--draft auto`, suffix decoding among its candidates) on
the inputs that once took it down with HTTP 500s (a repetitive prompt, JSON formats): every
request answers 200, with the target alone's answer, on the serial worker and the batching one.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import httpx
import pytest
from servekit import KEY, client, demo_server, post

import macspec
from macspec.engine.core.config import GenerationConfig
from macspec.engine.core.grammar import Grammar
from macspec.models.catalog import resolve_models
from macspec.models.pairs import open_pair
from macspec.models.templates import encode_messages

DEMO = Path(macspec.__file__).parent / "demo"
REPEATED = " ".join(["a"] * 60)
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}
HEADERS = {"Authorization": f"Bearer {KEY}"}
ASK = [{"role": "user", "content": "Alice is 30 years old. Give her as JSON."}]
MAX_TOKENS = 40


def resolved():
    return resolve_models(None, str(DEMO / "target"), str(DEMO / "draft"))


@pytest.fixture(scope="module", params=[1, 8], ids=["serial", "batch"])
def server(request):
    """`macspec serve -k 4`: the default drafter (`--draft auto`), at a draft length that
    drafts on this CPU too (k auto would rightly decode plainly here)."""
    with demo_server("4", MAX_TOKENS, max_batch=request.param, draft="auto") as running:
        yield running


@pytest.fixture(scope="module")
def plain():
    """The target alone (no drafter): what every answer must be."""
    opened = open_pair(resolved(), None, no_draft=True)

    def answer(prompt: list[int], grammar: Grammar | None = None, completion=False) -> str:
        # A completion continues its prompt's text: its leading space is kept.
        config = GenerationConfig(MAX_TOKENS, grammar=grammar, continuation=completion)
        return list(opened.engine.generate(prompt, config))[-1].text

    return answer, opened.tokenizer


@pytest.fixture(autouse=True)
def no_drafter_fails(caplog):
    """Not one drafter is switched off on these inputs: they answer with speculation."""
    with caplog.at_level(logging.WARNING, logger="macspec.engine"):
        yield
    assert not [r for r in caplog.records if "switched off" in r.getMessage()]


def test_a_repetitive_completion_answers_200(server, plain):
    answer, tokenizer = plain
    for _ in range(2):  # the second time, the first is in the suffix store too
        reply = post(server, "/completions", {"model": "tiny", "prompt": REPEATED})
        assert reply.status_code == 200, reply.text
        text = reply.json()["choices"][0]["text"]
        assert text == answer(tokenizer.encode(REPEATED), completion=True)


@pytest.mark.parametrize("fmt", ["json_object", "json_schema"])
def test_json_formats_answer_200_with_the_targets_answer(server, plain, fmt):
    answer, tokenizer = plain
    if fmt == "json_object":
        response_format = {"type": "json_object"}
        grammar = Grammar("json")
    else:
        schema = {"name": "person", "schema": PERSON}
        response_format = {"type": "json_schema", "json_schema": schema}
        grammar = Grammar("json_schema", json.dumps(PERSON))
    for _ in range(2):
        reply = client(server).chat.completions.create(
            model="tiny", messages=ASK, response_format=response_format
        )
        want = answer(encode_messages(tokenizer, ASK), grammar)
        assert reply.choices[0].message.content == want


@pytest.mark.parametrize("prompt", [" ", "\n\n\n"])
def test_a_prompt_of_whitespace_is_answered_on_every_api(server, plain, prompt):
    """Whitespace is content, as OpenAI's completions API takes it: every API answers it (a
    completion and Ollama's raw generate with the target alone's continuation); only a prompt
    with no characters is refused."""
    answer, tokenizer = plain
    completion = client(server).completions.create(model="tiny", prompt=prompt)
    assert completion.choices[0].text == answer(tokenizer.encode(prompt), completion=True)
    root = server.base_url[:-3]
    generate = {"model": "tiny", "prompt": prompt, "raw": True, "stream": False}
    reply = httpx.post(root + "/api/generate", json=generate, headers=HEADERS, timeout=30)
    assert reply.json()["response"] == answer(tokenizer.encode(prompt), completion=True)
    said = [{"role": "user", "content": prompt}]
    chats = [
        ("/chat/completions", {"model": "tiny", "messages": said}),
        ("/responses", {"model": "tiny", "input": prompt}),
        ("/messages", {"model": "tiny", "max_tokens": 4, "messages": said}),
    ]
    for path, body in chats:
        assert post(server, path, body).status_code == 200, path
    for empty in ("", [""], []):
        reply = post(server, "/completions", {"model": "tiny", "prompt": empty})
        assert reply.status_code == 400
        assert reply.json()["error"]["message"] == "the prompt is empty"
