"""Ollama's tools, thinking, fill-in-the-middle and model names, with the real `ollama` client:
the tool model (Qwen3's tokenizer and template, calls `get_weather`, answers "Done." after a
result; tests/toolkit.py) served with --any-model, and a scripted model that thinks on cue."""

from __future__ import annotations

import ollama
import pytest
from mlx_lm.tokenizer_utils import load as load_tokenizer
from ollama._utils import convert_function_to_tool
from servekit import save_tool_pair, tool_backend
from test_thinking import ANSWER, thinking_engine, write_qwen3_tokenizer
from toolkit import AGENT_CALLS

from macspec.chat.pairs import open_models
from macspec.engine.generate.loop import GenerationConfig
from macspec.models.catalog import resolve_models
from macspec.models.templates import encode_prompt
from macspec.serve.backend import Backend
from macspec.serve.ollama_schema import ChatRequest
from macspec.serve.server import ServerThread

NAME, ARGUMENTS = AGENT_CALLS[None]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def get_weather(city: str) -> str:
    """The weather in a city.

    Args:
        city: the city's name
    """
    return "clear, 21 C"


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return save_tool_pair(tmp_path_factory.mktemp("tools"))


@pytest.fixture(scope="module")
def server(folders):
    with ServerThread(tool_backend(folders, context_length=4096, any_model=True)) as running:
        yield running


@pytest.fixture(scope="module")
def alone(folders):
    """The tool model alone, no draft: greedy answers to compare the served ones with."""
    return open_models(resolve_models(None, str(folders[0]), None), no_draft=True).engine


def api(server) -> ollama.Client:
    return ollama.Client(host=server.base_url.removesuffix("/v1"), timeout=120)


def test_a_call_in_ollamas_shape_then_the_answer_to_its_result(server, alone):
    reply = api(server).chat(model="tool-model", messages=ASK, tools=[get_weather])
    (call,) = reply.message.tool_calls
    assert call.function.name == NAME and dict(call.function.arguments) == ARGUMENTS
    assert reply.message.content == "" and reply.done_reason == "stop"
    # Lossless: the served ids are the target alone's greedy answer to the rendered prompt.
    backend = server.backend
    served = backend.worker.recent[-1]
    tools = [convert_function_to_tool(get_weather).model_dump(exclude_none=True)]  # as sent
    turn = ChatRequest(model="tool-model", messages=ASK, tools=tools).to_turn()
    prompt = backend.render_turn(turn)[0]
    want = list(alone.generate(prompt, GenerationConfig(max_tokens=64)))[-1]
    assert served.tokens == want.tokens and served.stats.draft_proposed > 0
    history = [
        *ASK,
        {"role": "assistant", "content": "", "tool_calls": [call.model_dump()]},
        {"role": "tool", "content": get_weather("Paris"), "tool_name": NAME},
    ]
    answer = api(server).chat(model="tool-model", messages=history, tools=[get_weather])
    assert answer.message.content == "Done." and not answer.message.tool_calls


def test_a_streamed_call_comes_whole_in_one_object(server):
    parts = list(
        api(server).chat(model="tool-model", messages=ASK, tools=[get_weather], stream=True)
    )
    assert "".join(p.message.content for p in parts) == ""  # no tag text in the content
    calls = [c for p in parts for c in p.message.tool_calls or []]
    assert [(c.function.name, dict(c.function.arguments)) for c in calls] == [(NAME, ARGUMENTS)]
    assert parts[-1].done and parts[-1].done_reason == "stop"


def test_any_model_answers_every_name_under_the_name_sent(server):
    reply = api(server).chat(model="llama3.2:latest", messages=ASK, options={"num_predict": 2})
    assert reply.model == "llama3.2:latest" and reply.eval_count == 2
    assert [m.model for m in api(server).list().models] == ["tool-model:latest"]
    shown = api(server).show("tool-model")
    assert {"completion", "tools", "insert", "thinking"} <= set(shown.capabilities)


def test_suffix_fills_in_the_middle_in_the_models_own_format(server, alone):
    reply = api(server).generate(
        model="tool-model", prompt="def add(a, b):\n", suffix="\n    return c", keep_alive="5m"
    )
    tokenizer = server.backend.tokenizer
    text = "<|fim_prefix|>def add(a, b):\n<|fim_suffix|>\n    return c<|fim_middle|>"
    prompt = encode_prompt(tokenizer, text, raw=True)
    want = list(alone.generate(prompt, GenerationConfig(max_tokens=64)))[-1]
    assert reply.response == want.text and reply.prompt_eval_count == len(prompt)


def test_think_puts_the_reasoning_in_message_thinking(tmp_path):
    write_qwen3_tokenizer(tmp_path)
    tok = load_tokenizer(tmp_path, eos_token_ids=[258])
    engine = thinking_engine(tok, encode_prompt(tok, "2+2?"), ANSWER, draft=True)
    messages = [{"role": "user", "content": "2+2?"}]
    with ServerThread(Backend(engine, tok, "thinker", k=3)) as running:
        client = api(running)
        whole = client.chat(model="thinker", messages=messages, think=True)
        assert whole.message.thinking == "The user asks 2+2. That is 4."
        assert whole.message.content == "It is **4**."
        parts = list(client.chat(model="thinker", messages=messages, think="high", stream=True))
        assert "".join(p.message.thinking or "" for p in parts).strip() == (
            "The user asks 2+2. That is 4."
        )
        assert "".join(p.message.content for p in parts) == "It is **4**."
        generated = client.generate(model="thinker", prompt="2+2?", think=True)
        assert generated.thinking == "The user asks 2+2. That is 4."
        assert generated.response == "It is **4**."
        with pytest.raises(ollama.ResponseError) as error:
            client.chat(model="thinker", messages=messages, think="very")
        assert error.value.status_code == 400 and "invalid think value" in error.value.error


def test_tools_with_format_are_a_400(server):
    with pytest.raises(ollama.ResponseError) as error:
        api(server).chat(model="tool-model", messages=ASK, tools=[get_weather], format="json")
    assert error.value.status_code == 400 and "format" in error.value.error
