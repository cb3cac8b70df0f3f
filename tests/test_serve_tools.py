"""Tool calls through every protocol, with the real clients (`openai`, `anthropic`), on a tiny
model with Qwen3's real tokenizer and chat template that calls `get_weather` on any prompt and
answers "Done." after a tool result (tests/toolkit.py); and lossless: with speculation on, the
answer to a request with tools is plain greedy decoding of the same rendered prompt."""

from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest
from toolkit import AGENT_CALLS, save_tool_draft, save_tool_model

from macspec.chat.pairs import open_models
from macspec.engine.generate.loop import GenerationConfig
from macspec.models.catalog import resolve_models
from macspec.serve.anthropic_schema import MessagesRequest
from macspec.serve.backend import Backend, Defaults
from macspec.serve.schema import ChatCompletionRequest
from macspec.serve.server import ServerThread

NAME, ARGUMENTS = AGENT_CALLS[None]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
CLOCK = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("tools")
    return save_tool_model(root / "target"), save_tool_draft(root / "draft")


@pytest.fixture(scope="module")
def server(folders):
    loaded = open_models(resolve_models(None, str(folders[0]), str(folders[1])), "3")
    backend = Backend(
        loaded.engine,
        loaded.tokenizer,
        "tool-model",
        context_length=4096,
        defaults=Defaults(max_tokens=64),
    )
    with ServerThread(backend) as running:
        yield running


def chat(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=120)


def claude(server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url[:-3], api_key="x", max_retries=0)


def followup(call_id: str, arguments: str) -> list[dict]:
    call = {"id": call_id, "type": "function", "function": {"name": NAME, "arguments": arguments}}
    return [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "content": '{"sky": "clear", "c": 21}'},
    ]


# -- OpenAI chat completions ------------------------------------------------------------------
def test_chat_completions_return_the_call_then_answer_its_result(server):
    api = chat(server)
    reply = api.chat.completions.create(model="tool-model", messages=ASK, tools=[WEATHER])
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == NAME and json.loads(call.function.arguments) == ARGUMENTS
    answer = api.chat.completions.create(
        model="tool-model", messages=followup(call.id, call.function.arguments), tools=[WEATHER]
    )
    assert answer.choices[0].message.content == "Done."
    assert answer.choices[0].finish_reason == "stop" and not answer.choices[0].message.tool_calls


def test_streamed_calls_come_as_openai_sends_them(server):
    chunks = list(
        chat(server).chat.completions.create(
            model="tool-model", messages=ASK, tools=[WEATHER], stream=True
        )
    )
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.content or "" for d in deltas) == ""  # no tag text in the content
    calls = [tc for d in deltas for tc in d.tool_calls or []]
    assert calls[0].id and calls[0].function.name == NAME and calls[0].index == 0
    arguments = "".join(tc.function.arguments or "" for tc in calls)
    assert json.loads(arguments) == ARGUMENTS
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_tool_choice_none_required_and_named(server):
    api = chat(server)
    plain = api.chat.completions.create(
        model="tool-model", messages=ASK, tools=[WEATHER], tool_choice="none"
    )
    assert (
        not plain.choices[0].message.tool_calls and plain.choices[0].finish_reason != "tool_calls"
    )
    # This model calls anyway: that call is text, without its tags.
    assert "<tool_call>" not in plain.choices[0].message.content
    assert "get_weather" in plain.choices[0].message.content
    # A named function: the prompt ends with the call's opening, naming it; the model fills in
    # the arguments (this tiny model, with the ones it knows).
    named = dict(
        tools=[WEATHER, CLOCK], tool_choice={"type": "function", "function": {"name": "get_time"}}
    )
    request = ChatCompletionRequest(model="tool-model", messages=ASK, **named)
    prepared = server.backend.prepare_turn(request.to_turn())
    assert prepared.forced == '<tool_call>\n{"name": "get_time", "arguments":'
    tokenizer = server.backend.tokenizer
    rendered = tokenizer.decode(prepared.prompt)
    assert rendered.endswith("<|im_start|>assistant\n" + prepared.forced)
    # The opening ends where the whole call's tokens have a boundary: the model goes on from
    # ids it has seen before arguments, not from a lone space.
    whole = tokenizer.encode(
        rendered + ' {"city": "Paris"}}\n</tool_call>', add_special_tokens=False
    )
    assert whole[: len(prepared.prompt)] == prepared.prompt
    answered = api.chat.completions.create(model="tool-model", messages=ASK, **named)
    (call,) = answered.choices[0].message.tool_calls
    assert call.function.name == "get_time" and answered.choices[0].finish_reason == "tool_calls"
    forced = api.chat.completions.create(
        model="tool-model", messages=ASK, tools=[WEATHER], tool_choice="required"
    )
    assert forced.choices[0].message.tool_calls[0].function.name == NAME
    with pytest.raises(openai.BadRequestError, match="not in tools"):
        api.chat.completions.create(
            model="tool-model",
            messages=ASK,
            tools=[WEATHER],
            tool_choice={"type": "function", "function": {"name": "nope"}},
        )


def test_lossless_with_tools_and_speculation(server, folders):
    """The served answer (drafted, verified) is the target alone's greedy decoding of the very
    prompt the request rendered to."""
    backend = server.backend
    api = chat(server)
    alone = open_models(resolve_models(None, str(folders[0]), None), no_draft=True).engine
    for messages in (ASK, followup("call_1", json.dumps(ARGUMENTS))):
        api.chat.completions.create(model="tool-model", messages=messages, tools=[WEATHER])
        done = backend.worker.recent[-1]
        request = ChatCompletionRequest(model="tool-model", messages=messages, tools=[WEATHER])
        prompt = backend.prepare_turn(request.to_turn()).prompt
        want = list(alone.generate(prompt, GenerationConfig(max_tokens=64)))[-1]
        assert done.tokens == want.tokens
        assert done.stats.draft_proposed > 0  # speculation was on


# -- Anthropic Messages -----------------------------------------------------------------------
ANTHROPIC_TOOL = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": WEATHER["function"]["parameters"],
}


def test_anthropic_tool_use_create_stream_and_result(server):
    api = claude(server)
    reply = api.messages.create(
        model="tool-model", max_tokens=64, messages=ASK, tools=[ANTHROPIC_TOOL]
    )
    assert reply.stop_reason == "tool_use"
    (block,) = [b for b in reply.content if b.type == "tool_use"]
    assert block.name == NAME and block.input == ARGUMENTS and block.id.startswith("toolu_")
    with api.messages.stream(
        model="tool-model", max_tokens=64, messages=ASK, tools=[ANTHROPIC_TOOL]
    ) as stream:
        final = stream.get_final_message()
    (streamed,) = [b for b in final.content if b.type == "tool_use"]
    assert streamed.input == ARGUMENTS and final.stop_reason == "tool_use"
    answer = api.messages.create(
        model="tool-model",
        max_tokens=64,
        tools=[ANTHROPIC_TOOL],
        messages=[
            *ASK,
            {"role": "assistant", "content": [block.model_dump()]},
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": block.id,
                        "content": [{"type": "text", "text": "clear, 21 C"}],
                    }
                ],
            },
        ],
    )
    assert answer.content[0].text == "Done." and answer.stop_reason == "end_turn"


def test_anthropic_count_tokens_equals_the_input_counts(server):
    api = claude(server)
    body = {"model": "tool-model", "messages": ASK, "tools": [ANTHROPIC_TOOL], "system": "Hi."}
    counted = api.messages.count_tokens(**body)
    reply = api.messages.create(max_tokens=8, **body)
    u = reply.usage
    total = u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens
    assert counted.input_tokens == total


def test_anthropic_tool_choice_any_tool_and_no_parallel(server):
    api = claude(server)
    clock = {"name": "get_time", "input_schema": {"type": "object", "properties": {}}}
    named = api.messages.create(
        model="tool-model",
        max_tokens=64,
        messages=ASK,
        tools=[ANTHROPIC_TOOL, clock],
        tool_choice={"type": "tool", "name": "get_time", "disable_parallel_tool_use": True},
    )
    # The prompt opens the named call. No parallel calls: the end tag is a stop, and the
    # answer ends as a call (no stop sequence).
    request = MessagesRequest.model_validate(
        dict(model="tool-model", max_tokens=64, messages=ASK, tools=[ANTHROPIC_TOOL, clock],
             tool_choice={"type": "tool", "name": "get_time", "disable_parallel_tool_use": True})
    )  # fmt: skip
    prepared = server.backend.prepare_turn(request.to_turn())
    assert prepared.forced.endswith('{"name": "get_time", "arguments":')
    assert not prepared.parallel_tool_calls and "</tool_call>" in prepared.config.stop_strings
    assert [b.name for b in named.content if b.type == "tool_use"] == ["get_time"]
    assert (named.stop_reason, named.stop_sequence) == ("tool_use", None)
    forced = api.messages.create(
        model="tool-model", max_tokens=64, messages=ASK, tools=[ANTHROPIC_TOOL],
        tool_choice={"type": "any"},
    )  # fmt: skip
    assert forced.stop_reason == "tool_use"


# -- the Responses API ------------------------------------------------------------------------
RESPONSES_TOOL = {"type": "function", **WEATHER["function"]}


def test_responses_function_call_create_stream_and_output(server):
    api = chat(server)
    reply = api.responses.create(model="tool-model", input=ASK, tools=[RESPONSES_TOOL])
    (call,) = [item for item in reply.output if item.type == "function_call"]
    assert call.name == NAME and json.loads(call.arguments) == ARGUMENTS
    events = list(
        api.responses.create(model="tool-model", input=ASK, tools=[RESPONSES_TOOL], stream=True)
    )
    kinds = [e.type for e in events]
    assert "response.function_call_arguments.delta" in kinds
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert json.loads(done.arguments) == ARGUMENTS
    assert kinds[-1] == "response.completed"
    answer = api.responses.create(
        model="tool-model",
        tools=[RESPONSES_TOOL],
        input=[
            *ASK,
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": NAME,
                "arguments": call.arguments,
            },
            {"type": "function_call_output", "call_id": call.call_id, "output": "clear, 21 C"},
        ],
    )
    assert answer.output_text == "Done."


def test_a_raw_call_never_reaches_the_content_of_any_protocol(server):
    """The same request through every route: no tag text anywhere a client shows text."""
    base = server.base_url
    chat_body = {"model": "tool-model", "messages": ASK, "tools": [WEATHER], "stream": True}
    messages_body = {**chat_body, "tools": [ANTHROPIC_TOOL], "max_tokens": 64}
    responses_body = {"model": "tool-model", "input": ASK, "tools": [RESPONSES_TOOL]}
    bodies = [
        ("/chat/completions", chat_body),
        ("/messages", messages_body),
        ("/responses", {**responses_body, "stream": True}),
    ]
    for path, body in bodies:
        with httpx.stream("POST", base + path, json=body, timeout=60) as reply:
            text = "".join(reply.iter_text())
        assert "<tool_call>" not in text and "</tool_call>" not in text, path
