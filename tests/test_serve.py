"""`macspec serve` with the real `openai` client: lossless answers, streamed or not, figures,
stop strings, every 4xx, a failing generation, the API key (under load: test_serve_load.py)."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from servekit import (
    KEY,
    MESSAGES,
    client,
    post,
    served_pair_fixtures,
    still_answers,
)

from macspec.cli import main
from macspec.engine.generate.loop import GenerationConfig
from macspec.models.templates import encode_prompt

folders, expected, server = served_pair_fixtures()


# -- lossless, streamed or not, with the figures ---------------------------------------------
def test_greedy_answers_equal_macspec_run_streamed_or_not(server, folders, capsys):
    target, draft = folders
    code = main(
        ["run", "hello there", "--system", "Be brief.", "--model", str(target)]
        + ["--draft-model", str(draft), "-k", "3", "--max-tokens", "24", "--json"]
    )
    record = json.loads(capsys.readouterr().out)
    assert code == 0 and record["stats"]["draft_proposed"] > 0

    api = client(server)
    whole = api.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=24)
    assert whole.choices[0].message.content == record["text"]
    want_finish = "length" if record["finish_reason"] == "length" else "stop"
    assert whole.choices[0].finish_reason == want_finish
    assert whole.usage.prompt_tokens == len(record["prompt_tokens"])
    assert whole.usage.completion_tokens == len(record["tokens"])
    figures = whole.model_extra["macspec"]
    assert figures["draft"] == "model" and figures["k"] == 3
    assert 0 <= figures["acceptance"] <= 1 and figures["tokens_per_pass"] >= 1
    assert figures["draft_proposed"] > 0

    chunks = list(
        api.chat.completions.create(
            model="tiny",
            messages=MESSAGES,
            max_tokens=24,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == record["text"]
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finish) == 1 and "acceptance" in finish[0].model_extra["macspec"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(record["tokens"])
    assert all(c.usage is None for c in chunks[:-1])


def test_raw_sse_ends_with_done(server):
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 4, "stream": True}
    with httpx.stream(
        "POST",
        server.base_url + "/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=30,
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in events)
    assert events[-1] == "data: [DONE]"
    first = json.loads(events[0][6:])
    assert first["object"] == "chat.completion.chunk" and first["choices"][0]["index"] == 0


def test_completions_and_models(server, expected):
    api = client(server)
    assert [m.id for m in api.models.list()] == ["tiny"]
    assert api.models.retrieve("tiny").id == "tiny"
    prompt_ids = encode_prompt(expected.tokenizer, "def f(x):", raw=True)
    config = GenerationConfig(10, continuation=True)  # a completion continues its prompt
    want = list(expected.engine.generate(prompt_ids, config))[-1].text
    got = api.completions.create(model="tiny", prompt="def f(x):", max_tokens=10)
    assert got.choices[0].text == want and got.usage.prompt_tokens == len(prompt_ids)
    streamed = api.completions.create(model="tiny", prompt="def f(x):", max_tokens=10, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == want
    assert httpx.get(server.base_url.removesuffix("/v1") + "/health").json()["status"] == "ok"


def test_stop_strings_and_sampling_with_a_seed(server, expected):
    api = client(server)
    full = expected.text(MESSAGES, 24)
    stop = full[5:7]
    cut = api.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=24, stop=[stop])
    assert cut.choices[0].message.content == full[: full.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    sampled = [
        api.chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=12, temperature=0.8, top_p=0.9, seed=7
        )
        .choices[0]
        .message.content
        for _ in range(2)
    ]
    assert sampled[0] == sampled[1]


# -- every 4xx, and the server still answering -----------------------------------------------
BAD = [
    ("/chat/completions", {"model": "tiny"}, 400, "messages"),
    ("/chat/completions", '{"model": ', 400, None),
    ("/chat/completions", [1, 2], 400, None),
    ("/chat/completions", {"model": "tiny", "messages": []}, 400, "messages"),
    ("/chat/completions", {"model": "t", "messages": [{"role": "robot"}]}, 400, "messages.0.role"),
    ("/chat/completions", {"model": "tiny", "messages": MESSAGES, "n": 2}, 400, "n"),
    ("/chat/completions", {"model": "tiny", "messages": MESSAGES, "temperature": -1}, 400, None),
    ("/chat/completions", {"model": "tiny", "messages": MESSAGES, "max_tokens": 0}, 400, None),
    ("/chat/completions", {"model": "tiny", "messages": MESSAGES, "logprobs": True}, 400, None),
    ("/chat/completions", {"model": "tiny", "messages": MESSAGES, "stop": 5}, 400, "stop"),
    ("/chat/completions", {"model": "tiny", "messages": MESSAGES, "stream": "yes"}, 400, "stream"),
    (
        "/chat/completions",
        {"model": "tiny", "messages": MESSAGES, "response_format": {"type": "grammar"}},
        400,
        "response_format",
    ),
    (
        "/chat/completions",
        {"model": "tiny", "messages": MESSAGES, "tool_choice": "required"},
        400,
        "tools",
    ),
    (
        "/chat/completions",
        {"model": "tiny", "messages": [{"role": "user", "content": None}]},
        400,
        "messages.0",
    ),
    (
        "/chat/completions",
        {"model": "tiny", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
        400,
        "messages.0.content.0.type",
    ),
    ("/completions", {"model": "tiny", "prompt": ["a", "b"]}, 400, "prompt"),
    ("/completions", {"model": "tiny", "prompt": [99999]}, 400, "prompt"),
    ("/chat/completions", {"model": "gpt-4", "messages": MESSAGES}, 404, "model"),
    ("/no/such/route", {}, 404, None),
    ("/chat/completions", "x" * (33 << 20), 413, None),
    (
        "/chat/completions",
        {"model": "tiny", "messages": [{"role": "user", "content": "word " * 300}]},
        413,
        "messages",
    ),
]


@pytest.mark.parametrize(("path", "body", "status", "param"), BAD)
def test_bad_requests_get_openai_errors_and_the_server_goes_on(server, path, body, status, param):
    reply = post(server, path, body)
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"] and "Traceback" not in error["message"]
    if param is not None:
        assert error["param"] == param
    if "image_url" in str(body):
        assert "image_url is not supported: macspec serves text models" in error["message"]
    still_answers(server)


@pytest.mark.parametrize(
    ("ours", "openais"),
    [("length", "length"), ("context", "length"), ("stop", "stop"), ("stop_string", "stop")],
)
def test_the_context_window_is_openais_length(ours, openais):
    from types import SimpleNamespace

    from macspec.serve.render import finish_reason

    assert finish_reason(SimpleNamespace(finish_reason=ours)) == openais


def test_the_client_sees_the_status(server):
    with pytest.raises(openai.BadRequestError):
        client(server).chat.completions.create(model="tiny", messages=MESSAGES, n=3)
    with pytest.raises(openai.NotFoundError):
        client(server).chat.completions.create(model="nope", messages=MESSAGES)


def test_a_failing_generation_is_a_500_without_a_traceback(server, monkeypatch):
    cache = server.backend.worker.prompt_cache

    def broken(prompt):
        raise RuntimeError("simulated device failure")

    monkeypatch.setattr(cache, "prepare", broken)
    reply = post(server, "/chat/completions", {"model": "tiny", "messages": MESSAGES})
    assert reply.status_code == 500
    assert reply.json()["error"]["type"] == "server_error"
    assert "simulated" not in reply.text and "Traceback" not in reply.text
    with pytest.raises(openai.APIError):
        list(client(server).chat.completions.create(model="tiny", messages=MESSAGES, stream=True))
    monkeypatch.undo()
    still_answers(server)


def test_the_api_key_is_enforced_and_a_missing_one_is_named_as_such(server):
    body = {"model": "tiny", "messages": MESSAGES}
    missing = post(server, "/chat/completions", body, None).json()["error"]
    assert missing["code"] == "missing_api_key" and "missing API key" in missing["message"]
    wrong = post(server, "/chat/completions", body, "wrong")
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
    assert "Incorrect API key" in wrong.json()["error"]["message"]
    by_header = httpx.post(
        server.base_url + "/chat/completions", json=body, headers={"x-api-key": KEY}
    )
    assert by_header.status_code == 200  # Anthropic's clients send the key this way
    with pytest.raises(openai.AuthenticationError):
        client(server, api_key="wrong").models.list()
    still_answers(server)
