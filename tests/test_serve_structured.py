"""Structured outputs through the real clients: the openai SDK's `chat.completions.parse` and
`responses.parse`, the anthropic SDK's `messages.parse`, each with a Pydantic model; streamed
and not; the served answer is the engine's own under the same grammar (greedy); a bad schema
is a 400 in each protocol's shape and the server goes on answering; a grammar max_tokens cuts
ends with 'length'.

The demo pair writes Python, not JSON: whatever it answers here is the mask's doing. Each test
runs on the serial worker and on the batching one (`macspec serve`'s default, --max-batch 8).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import anthropic
import openai
import pytest
from anthropic.lib._parse._transform import transformed_json_schema
from pydantic import BaseModel, Field, TypeAdapter
from servekit import KEY, MESSAGES, client, demo_server, load_engine, post, still_answers

import macspec
from macspec.engine.core.config import GenerationConfig
from macspec.engine.core.grammar import Grammar
from macspec.models.templates import encode_messages

DEMO = Path(macspec.__file__).parent / "demo"
ASK = [{"role": "user", "content": "Give me a person as JSON."}]


class Person(BaseModel):
    name: str = Field(max_length=12)
    age: int = Field(ge=0, le=150)


class Pick(BaseModel):
    """What Anthropic's schemas keep (the SDK moves lengths and bounds into descriptions)."""

    name: Literal["Ada", "Alan", "Grace"]
    likes_python: bool


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
BAD_SCHEMA = {"type": "object", "properties": {"a": {"type": "nosuch"}}}


@pytest.fixture(scope="module", params=[1, 8], ids=["serial", "batch"])
def server(request):
    """`macspec serve --max-batch 1` (the serial worker) and its default, --max-batch 8."""
    with demo_server("3", 96, max_batch=request.param) as running:
        yield running


@pytest.fixture(scope="module")
def reference():
    """The engine alone, greedy, under a grammar: what the server must send back."""
    engine, tokenizer = load_engine(DEMO / "target", DEMO / "draft")

    def answer(messages, grammar: Grammar, max_tokens: int = 96):
        prompt = encode_messages(tokenizer, messages)
        return list(engine.generate(prompt, GenerationConfig(max_tokens, grammar=grammar)))[-1]

    return answer


def anthropic_client(server) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=server.base_url.removesuffix("/v1"), api_key=KEY, max_retries=0, timeout=60
    )


# -- OpenAI chat completions -------------------------------------------------------------------
def test_chat_parse_gives_the_pydantic_model_and_the_engines_own_answer(server, reference):
    reply = client(server).chat.completions.parse(
        model="tiny", messages=ASK, response_format=Person, max_tokens=96
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, Person)
    # The SDK sends its strict schema; the answer is the target's own under that mask.
    expected = reference(ASK, Grammar.json_schema(SCHEMA))
    assert choice.message.content == expected.text
    assert Person.model_validate_json(expected.text) == choice.message.parsed


def test_chat_json_schema_streamed_equals_whole(server):
    spec = {"name": "person", "schema": SCHEMA, "strict": True}
    fmt = {"type": "json_schema", "json_schema": spec}
    whole = client(server).chat.completions.create(
        model="tiny", messages=ASK, response_format=fmt, max_tokens=96
    )
    chunks = client(server).chat.completions.create(
        model="tiny", messages=ASK, response_format=fmt, max_tokens=96, stream=True
    )
    parts, finish = [], None
    for chunk in chunks:
        if chunk.choices:
            parts.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
    assert "".join(parts) == whole.choices[0].message.content
    assert finish == "stop"
    Person.model_validate_json("".join(parts))


def test_chat_json_object_is_a_json_object(server):
    reply = client(server).chat.completions.create(
        model="tiny", messages=ASK, response_format={"type": "json_object"}, max_tokens=96
    )
    choice = reply.choices[0]
    if choice.finish_reason == "stop":  # room to close it: it parses
        assert isinstance(json.loads(choice.message.content), dict)
    else:  # cut: still the start of one
        assert choice.finish_reason == "length" and choice.message.content.startswith("{")


def test_a_grammar_cut_by_max_tokens_ends_with_length(server):
    reply = client(server).chat.completions.create(
        model="tiny",
        messages=ASK,
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}},
        max_tokens=3,
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "length"
    assert reply.usage.completion_tokens == 3
    assert choice.message.content.startswith('{"')
    with pytest.raises(openai.LengthFinishReasonError):
        client(server).chat.completions.parse(
            model="tiny", messages=ASK, response_format=Person, max_tokens=3
        )


@pytest.mark.parametrize(
    "fmt, says",
    [
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": BAD_SCHEMA}}, "nosuch"),
        ({"type": "json_schema", "json_schema": {"name": "x", "schema": [1]}}, "JSON object"),
        ({"type": "json_schema"}, "json_schema"),
        ({"type": "grammar"}, "not supported"),
        (
            {"type": "json_schema", "json_schema": {"name": "x", "schema": {"x": "y" * 300_000}}},
            "bytes",
        ),
    ],
)
def test_a_bad_format_is_a_400_and_the_server_goes_on(server, fmt, says):
    reply = post(
        server, "/chat/completions", {"model": "tiny", "messages": MESSAGES, "response_format": fmt}
    )
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == "response_format"
    assert error["type"] == "invalid_request_error"
    assert says in error["message"]
    assert "\n" not in error["message"]
    still_answers(server)


def test_a_format_with_tools_is_a_400(server):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    body = {
        "model": "tiny",
        "messages": MESSAGES,
        "tools": tools,
        "response_format": {"type": "json_object"},
    }
    reply = post(server, "/chat/completions", body)
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == "response_format"


# -- Responses -----------------------------------------------------------------------------------
def test_responses_parse_gives_the_pydantic_model(server, reference):
    reply = client(server).responses.parse(
        model="tiny", input=ASK, text_format=Person, max_output_tokens=96
    )
    assert isinstance(reply.output_parsed, Person)
    assert reply.output_text == reference(ASK, Grammar.json_schema(SCHEMA)).text
    assert reply.text.format.type == "json_schema"


def test_responses_bad_schema_is_a_400(server):
    fmt = {"type": "json_schema", "name": "x", "schema": BAD_SCHEMA}
    reply = post(server, "/responses", {"model": "tiny", "input": "hi", "text": {"format": fmt}})
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == "text.format"
    assert "cannot be used" in reply.json()["error"]["message"]
    still_answers(server)


# -- Anthropic -----------------------------------------------------------------------------------
def test_anthropic_parse_gives_the_pydantic_model(server, reference):
    reply = anthropic_client(server).messages.parse(
        model="tiny", messages=ASK, output_format=Pick, max_tokens=96
    )
    assert reply.stop_reason == "end_turn"
    assert isinstance(reply.parsed_output, Pick)
    sent = transformed_json_schema(TypeAdapter(Pick))  # what the SDK sends
    assert reply.content[0].text == reference(ASK, Grammar.json_schema(sent)).text


def test_anthropic_beta_output_format_streamed(server):
    body = {
        "model": "tiny",
        "max_tokens": 96,
        "messages": ASK,
        "stream": True,
        "output_format": {"type": "json_schema", "schema": SCHEMA},
    }
    reply = post(server, "/messages", body)
    assert reply.status_code == 200
    text = "".join(
        json.loads(line[6:])["delta"].get("text", "")
        for line in reply.text.splitlines()
        if line.startswith("data: ") and '"content_block_delta"' in line
    )
    Person.model_validate_json(text)


def test_anthropic_bad_schema_is_a_400_in_its_shape(server):
    body = {
        "model": "tiny",
        "max_tokens": 16,
        "messages": ASK,
        "output_config": {"format": {"type": "json_schema", "schema": BAD_SCHEMA}},
    }
    reply = post(server, "/messages", body)
    assert reply.status_code == 400
    assert reply.json()["type"] == "error"
    assert reply.json()["error"]["type"] == "invalid_request_error"
    assert "cannot be used" in reply.json()["error"]["message"]
    with pytest.raises(anthropic.BadRequestError):
        anthropic_client(server).messages.create(
            model="tiny",
            max_tokens=16,
            messages=ASK,
            output_config={"format": {"type": "json_schema", "schema": BAD_SCHEMA}},
        )
    still_answers(server)
