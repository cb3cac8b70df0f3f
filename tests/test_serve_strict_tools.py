"""Strict tools: a forced call (tool_choice 'required', a named function, Anthropic's 'any' or
'tool') to a strict tool is written by a grammar in the model's own format (Qwen's
`<tool_call>` tags), its arguments held to the function's parameters. The tiny tool model
always calls get_weather for Paris (tests/toolkit.py): a schema that allows only Lyon or Nice
shows the mask at work, through the real clients."""

from __future__ import annotations

import json

import anthropic
import openai
import pytest
from pydantic import BaseModel
from toolkit import save_tool_draft, save_tool_model

from macspec.chat.pairs import open_models
from macspec.models.catalog import resolve_models
from macspec.serve.backend import Backend, Defaults
from macspec.serve.schema import ChatCompletionRequest
from macspec.serve.server import ServerThread

CITIES = ["Lyon", "Nice"]
PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": CITIES}},
    "required": ["city"],
    "additionalProperties": False,
}
STRICT = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": PARAMETERS, "strict": True},
}
LOOSE = {**STRICT, "function": {**STRICT["function"], "strict": False}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


class Weather(BaseModel):
    city: str


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("strict")
    folders = save_tool_model(root / "target"), save_tool_draft(root / "draft")
    loaded = open_models(resolve_models(None, str(folders[0]), str(folders[1])), "3")
    backend = Backend(
        loaded.engine, loaded.tokenizer, "tool-model", defaults=Defaults(max_tokens=64)
    )
    with ServerThread(backend) as running:
        yield running


def chat(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=120)


def test_a_named_strict_call_fits_its_parameters(server):
    reply = chat(server).chat.completions.create(
        model="tool-model", messages=ASK, tools=[STRICT], tool_choice=NAMED
    )
    choice = reply.choices[0]
    (call,) = choice.message.tool_calls
    assert choice.finish_reason == "tool_calls"
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments)["city"] in CITIES
    # The same request with the tool not strict: the model's own Paris (the opening forced).
    loose = chat(server).chat.completions.create(
        model="tool-model", messages=ASK, tools=[LOOSE], tool_choice=NAMED
    )
    assert json.loads(loose.choices[0].message.tool_calls[0].function.arguments) == {
        "city": "Paris"
    }


def test_the_grammar_writes_the_call_not_the_prompt(server):
    backend = server.backend
    strict = ChatCompletionRequest(model="tool-model", messages=ASK, tools=[STRICT],
                                   tool_choice="required").to_turn()  # fmt: skip
    prepared = backend.prepare_turn(strict)
    assert prepared.forced == "" and prepared.config.grammar is not None
    assert prepared.config.grammar.kind == "lark"
    assert backend.tokenizer.decode(prepared.prompt).endswith("<|im_start|>assistant\n")
    loose = ChatCompletionRequest(model="tool-model", messages=ASK, tools=[LOOSE],
                                  tool_choice="required").to_turn()  # fmt: skip
    prepared = backend.prepare_turn(loose)
    assert prepared.forced.startswith("<tool_call>") and prepared.config.grammar is None


def test_parse_with_a_pydantic_tool_and_streamed(server):
    tool = openai.pydantic_function_tool(Weather, name="get_weather")
    tool["function"]["parameters"]["properties"]["city"]["enum"] = CITIES
    reply = chat(server).chat.completions.parse(
        model="tool-model", messages=ASK, tools=[tool], tool_choice="required"
    )
    (call,) = reply.choices[0].message.tool_calls
    assert isinstance(call.function.parsed_arguments, Weather)
    assert call.function.parsed_arguments.city in CITIES
    chunks = chat(server).chat.completions.create(
        model="tool-model", messages=ASK, tools=[tool], tool_choice="required", stream=True
    )
    arguments = "".join(
        c.choices[0].delta.tool_calls[0].function.arguments or ""
        for c in chunks
        if c.choices and c.choices[0].delta.tool_calls
    )
    assert arguments == call.function.arguments


def test_anthropic_and_responses_strict_tools(server):
    claude = anthropic.Anthropic(base_url=server.base_url[:-3], api_key="x", max_retries=0)
    tool = {"name": "get_weather", "input_schema": PARAMETERS, "strict": True}
    reply = claude.messages.create(
        model="tool-model",
        max_tokens=64,
        messages=ASK,
        tools=[tool],
        tool_choice={"type": "tool", "name": "get_weather"},
    )
    (use,) = [block for block in reply.content if block.type == "tool_use"]
    assert reply.stop_reason == "tool_use" and use.input["city"] in CITIES
    function = {"type": "function", "name": "get_weather", "parameters": PARAMETERS}
    answer = chat(server).responses.create(
        model="tool-model", input=ASK, tools=[{**function, "strict": True}], tool_choice="required"
    )
    (call,) = [item for item in answer.output if item.type == "function_call"]
    assert json.loads(call.arguments)["city"] in CITIES


def test_a_strict_tool_with_a_bad_schema_is_a_400(server):
    bad = {**STRICT, "function": {**STRICT["function"], "parameters": {"type": "nosuch"}}}
    with pytest.raises(openai.BadRequestError, match="cannot be used") as caught:
        chat(server).chat.completions.create(
            model="tool-model", messages=ASK, tools=[bad], tool_choice="required"
        )
    assert caught.value.body["param"] == "tools"
    still = chat(server).chat.completions.create(model="tool-model", messages=ASK, max_tokens=4)
    assert still.choices[0].finish_reason in ("length", "stop", "tool_calls")
