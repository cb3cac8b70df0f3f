"""Ollama's REST API with the real `ollama` client on the demo pair: chat and generate, whole
and streamed, equal to mlx-lm's greedy decoding of the target alone and to the OpenAI route;
`format` (a Pydantic schema) equal to the engine's own answer under the same mask; the final
object's metrics; options (num_predict, stop, seed, num_ctx); the listings (tags, show, ps,
version, /); Ollama's errors (unknown model 404, images 400, pull and friends 501)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import httpx
import mlx_lm
import ollama
import pytest
from losslesskit import reference
from pydantic import BaseModel, ConfigDict, Field
from servekit import KEY, client, demo_server, load_engine

import macspec
from macspec.engine.core.config import GenerationConfig
from macspec.engine.core.grammar import Grammar
from macspec.models.templates import encode_messages, encode_prompt

DEMO = Path(macspec.__file__).parent / "demo"
ASK = [{"role": "user", "content": "Write a function that adds two numbers."}]


class Person(BaseModel):
    model_config = ConfigDict(extra="forbid")  # else the demo pair goes on with more keys

    name: str = Field(max_length=12)
    age: int = Field(ge=0, le=150)


@pytest.fixture(scope="module")
def server():
    with demo_server("3", 24, model_id="demo", context_length=512) as running:
        yield running


@pytest.fixture(scope="module")
def target():
    """The demo target alone, under mlx-lm, and its tokenizer."""
    model, tokenizer = mlx_lm.load(str(DEMO / "target"))
    eos = frozenset(tokenizer.eos_token_ids)

    def greedy(prompt: list[int], max_tokens: int) -> str:
        return tokenizer.decode(greedy_ids(prompt, max_tokens))

    def greedy_ids(prompt: list[int], max_tokens: int) -> list[int]:
        return reference(model, prompt, max_tokens, eos)

    greedy.ids = greedy_ids

    return greedy, tokenizer


def api(server, **kwargs) -> ollama.Client:
    host = server.base_url.removesuffix("/v1")
    return ollama.Client(host=host, headers={"Authorization": f"Bearer {KEY}"}, **kwargs)


def test_chat_whole_and_streamed_is_the_target_alones_greedy_answer(server, target):
    greedy, tokenizer = target
    ids = greedy.ids(encode_messages(tokenizer, ASK), 24)
    want = tokenizer.decode(ids)
    whole = api(server).chat(model="demo", messages=ASK)
    assert whole.message.role == "assistant" and whole.message.content == want
    assert whole.done and whole.done_reason in ("stop", "length")
    assert whole.prompt_eval_count == len(encode_messages(tokenizer, ASK))
    assert whole.eval_count == len(ids)
    for name in ("total_duration", "load_duration", "prompt_eval_duration", "eval_duration"):
        assert isinstance(whole[name], int) and whole[name] >= 0
    assert whole.total_duration >= whole.eval_duration > 0
    parts = list(api(server).chat(model="demo:latest", messages=ASK, stream=True))
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    assert "".join(p.message.content for p in parts) == want
    assert parts[-1].message.content == "" and parts[-1].eval_count == whole.eval_count
    # The OpenAI route says the same.
    openai_text = client(server).chat.completions.create(model="demo", messages=ASK)
    assert openai_text.choices[0].message.content == want


def test_generate_templates_the_prompt_and_raw_does_not(server, target):
    greedy, tokenizer = target
    prompt = "Write a function that adds two numbers."
    whole = api(server).generate(model="demo", prompt=prompt, system="Be brief.")
    templated = encode_prompt(tokenizer, prompt, system="Be brief.")
    assert whole.response == greedy(templated, 24)
    assert list(whole.context[: len(templated)]) == templated
    parts = list(api(server).generate(model="demo", prompt="def add(a, b):", raw=True, stream=True))
    raw_ids = encode_prompt(tokenizer, "def add(a, b):", raw=True)
    assert "".join(p.response for p in parts) == greedy(raw_ids, 24)
    assert parts[-1].done and parts[-1].prompt_eval_count == len(raw_ids)
    assert parts[-1].context is None  # raw mode returns no context, as Ollama's


def test_num_predict_stop_and_num_ctx(server, target):
    greedy, tokenizer = target
    prompt = encode_messages(tokenizer, ASK)
    full = greedy(prompt, 40)
    cut = api(server).chat(model="demo", messages=ASK, options={"num_predict": 5})
    assert cut.done_reason == "length" and cut.eval_count == 5
    assert full.startswith(cut.message.content)
    stop = full[8:11]
    stopped = api(server).chat(
        model="demo", messages=ASK, options={"num_predict": 40, "stop": [stop]}
    )
    assert stopped.done_reason == "stop" and stopped.message.content == full[: full.index(stop)]
    # num_ctx: prompt and answer together fill at most that many tokens.
    small = api(server).chat(
        model="demo", messages=ASK, options={"num_predict": -1, "num_ctx": len(prompt) + 3}
    )
    assert small.done_reason == "length" and small.eval_count <= 3
    with pytest.raises(ollama.ResponseError) as error:
        api(server).chat(model="demo", messages=ASK, options={"num_ctx": 4})
    assert error.value.status_code == 400 and "too long" in error.value.error


def test_seeded_sampling_repeats_and_unknown_options_are_logged_once(server, caplog):
    options = {"temperature": 1.0, "top_k": 50, "seed": 7, "num_predict": 8, "mirostat": 1}
    with caplog.at_level(logging.INFO, logger="macspec.serve"):
        one = api(server).chat(model="demo", messages=ASK, options=options)
        two = api(server).chat(model="demo", messages=ASK, options=options)
    assert one.message.content == two.message.content and one.eval_count == 8
    said = [r.getMessage() for r in caplog.records if "not implemented" in r.getMessage()]
    assert said == ["ollama: options not implemented, ignored: mirostat"]


def test_format_schema_is_the_engines_own_answer_under_the_mask(server):
    schema = Person.model_json_schema()
    ask = [{"role": "user", "content": "Give me a person as JSON."}]
    reply = api(server).chat(model="demo", messages=ask, format=schema, options={"num_predict": 96})
    engine, tokenizer = load_engine(DEMO / "target", DEMO / "draft")
    config = GenerationConfig(96, grammar=Grammar.json_schema(schema))
    want = list(engine.generate(encode_messages(tokenizer, ask), config))[-1]
    assert reply.message.content == want.text
    assert reply.done_reason == "stop"
    Person.model_validate_json(reply.message.content)
    parts = api(server).generate(
        model="demo", prompt="Give me a person as JSON.", format="json", stream=True
    )
    parts = list(parts)
    text = "".join(p.response for p in parts)
    if parts[-1].done_reason == "stop":  # room to close it: it parses
        json.loads(text)
    else:
        assert parts[-1].done_reason == "length" and text


def test_listings_describe_the_served_model(server):
    listed = api(server).list().models
    assert [m.model for m in listed] == ["demo:latest"]
    details = listed[0].details
    assert details.family == "llama" and details.quantization_level == "Q4"
    assert details.parameter_size.endswith("M")
    shown = api(server).show("demo")
    assert shown.modelinfo["general.architecture"] == "llama"
    assert shown.modelinfo["llama.block_count"] == 4
    assert shown.modelinfo["llama.vocab_size"] == 2048
    assert "num_ctx" in shown.parameters and "completion" in shown.capabilities
    assert "{%" in shown.template  # the model's own chat template
    running = api(server).ps().models
    assert running[0].model == "demo:latest" and running[0].size_vram == listed[0].size > 0
    base = server.base_url.removesuffix("/v1")
    assert httpx.get(base + "/").text == "Ollama is running"
    assert httpx.head(base + "/").status_code == 200
    assert httpx.get(base + "/api/version").json()["version"].count(".") == 2


def test_ollama_errors(server):
    with pytest.raises(ollama.ResponseError) as error:
        api(server).chat(model="llama3.2", messages=ASK)
    assert error.value.status_code == 404 and error.value.error == "model 'llama3.2' not found"
    with pytest.raises(ollama.ResponseError) as error:
        api(server).show("llama3.2")
    assert error.value.status_code == 404
    image = [{"role": "user", "content": "what is this?", "images": ["aGk="]}]
    with pytest.raises(ollama.ResponseError) as error:
        api(server).chat(model="demo", messages=image)
    assert error.value.status_code == 400 and "images are not read yet" in error.value.error
    base = server.base_url.removesuffix("/v1")
    headers = {"Authorization": f"Bearer {KEY}"}
    for fmt, says in (("yaml", "invalid format"), ({"type": "nosuch"}, "nosuch")):
        body = {"model": "demo", "messages": ASK, "format": fmt}
        reply = httpx.post(base + "/api/chat", json=body, headers=headers)
        assert reply.status_code == 400 and says in reply.json()["error"], reply.text
    with pytest.raises(ollama.ResponseError) as error:
        api(server).generate(model="demo", prompt="def add(a, b):", suffix="    return c")
    assert error.value.status_code == 400 and "does not support insert" in error.value.error
    with pytest.raises(ollama.ResponseError) as error:
        api(server).chat(model="demo", messages=ASK, think=True)
    assert (
        error.value.status_code == 400 and error.value.error == '"demo" does not support thinking'
    )
    with pytest.raises(ollama.ResponseError) as error:
        api(server).pull("llama3.2")
    assert error.value.status_code == 501 and "macspec pull" in error.value.error
    with pytest.raises(ollama.ResponseError) as error:
        api(server).embed(model="demo", input="hello")
    assert error.value.status_code == 501 and "embeddings are not served" in error.value.error
    with pytest.raises(ollama.ResponseError) as error:
        api(server).delete("demo")
    assert error.value.status_code == 501 and "macspec rm" in error.value.error
    unkeyed = ollama.Client(host=server.base_url.removesuffix("/v1"))
    with pytest.raises(ollama.ResponseError) as error:
        unkeyed.list()
    assert error.value.status_code == 401 and "API key" in error.value.error
    # Nothing to generate: the model is loaded, as Ollama says.
    assert api(server).chat(model="demo", messages=[]).done_reason == "load"
    body = {"model": "demo", "prompt": "", "keep_alive": 0}
    reply = httpx.post(base + "/api/generate", json=body, headers=headers)
    assert reply.json()["done_reason"] == "unload"
    assert json.loads(httpx.get(base + "/api/nope", headers=headers).text)["error"]
