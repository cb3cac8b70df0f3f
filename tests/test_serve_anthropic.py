"""Anthropic's Messages API with the real `anthropic` SDK: whole and streamed answers equal to
greedy decoding, usage that adds up to the prompt, count_tokens, every error type in
Anthropic's shape with the server answering afterwards, and a thinking budget."""

from __future__ import annotations

import logging
import threading

import anthropic
import httpx
import pytest
from servekit import KEY, served_pair_fixtures, still_answers

from macspec.engine.generate.loop import GenerationConfig

folders, expected, server = served_pair_fixtures()
MESSAGES = [{"role": "user", "content": "hello there"}]
CHAT = [{"role": "system", "content": "Be brief."}, *MESSAGES]


def claude(server, **kwargs) -> anthropic.Anthropic:
    kwargs.setdefault("api_key", KEY)
    return anthropic.Anthropic(base_url=server.base_url[:-3], max_retries=0, timeout=60, **kwargs)


def test_create_and_stream_answer_as_greedy_decoding_does(server, expected):
    want = expected.done(CHAT, 12)
    api = claude(server)
    whole = api.messages.create(model="tiny", system="Be brief.", messages=MESSAGES, max_tokens=12)
    assert whole.content[0].type == "text" and whole.content[0].text == want.text
    assert whole.stop_reason == ("max_tokens" if want.finish_reason == "length" else "end_turn")
    prompt = len(expected.prompt(CHAT))
    usage = whole.usage
    assert (
        usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens
        == prompt
    )
    assert usage.output_tokens == len(want.tokens) + want.stats.end_tokens
    with api.messages.stream(
        model="tiny",
        system=[{"type": "text", "text": "Be brief."}],
        messages=MESSAGES,
        max_tokens=12,
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == want.text and final.content[0].text == want.text
    # The second time the prompt comes from the cache: the counts still add up.
    u = final.usage
    assert u.cache_read_input_tokens > 0
    assert u.input_tokens + u.cache_read_input_tokens + u.cache_creation_input_tokens == prompt


def test_the_raw_stream_is_anthropics_event_sequence(server):
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 4, "stream": True}
    headers = {"x-api-key": KEY, "anthropic-version": "2023-06-01", "anthropic-beta": "x,y"}
    url = server.base_url + "/messages?beta=true"
    with httpx.stream("POST", url, json=body, headers=headers, timeout=30) as reply:
        assert reply.status_code == 200
        lines = [line for line in reply.iter_lines() if line]
    names = [line[7:] for line in lines if line.startswith("event: ")]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    assert names.count("content_block_start") == names.count("content_block_stop") == 1
    assert len([line for line in lines if line.startswith("data: ")]) == len(names)


def test_a_stop_sequence_is_named(server, expected):
    full = expected.text(CHAT, 16)
    stop = full[4:6]
    reply = claude(server).messages.create(
        model="tiny", system="Be brief.", messages=MESSAGES, max_tokens=16, stop_sequences=[stop]
    )
    assert reply.stop_reason == "stop_sequence" and reply.stop_sequence == stop
    assert reply.content[0].text == full[: full.index(stop)]


def test_count_tokens_counts_what_a_request_would_prefill(server, expected):
    api = claude(server)
    counted = api.messages.count_tokens(model="tiny", system="Be brief.", messages=MESSAGES)
    assert counted.input_tokens == len(expected.prompt(CHAT))
    # ?beta=true, as Claude Code calls it
    reply = httpx.post(
        server.base_url + "/messages/count_tokens?beta=true",
        json={"model": "tiny", "messages": MESSAGES},
        headers={"x-api-key": KEY},
        timeout=30,
    )
    assert reply.json() == {"input_tokens": len(expected.prompt(MESSAGES))}


def test_history_blocks_and_a_system_message_in_messages_are_accepted(server):
    messages = [
        {"role": "system", "content": "Mid-conversation system note."},
        {
            "role": "user",
            "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "hm", "signature": "x"},
                {"type": "redacted_thinking", "data": "abc"},
                {"type": "text", "text": "hello"},
            ],
        },
        {"role": "user", "content": "again"},
    ]
    reply = claude(server).messages.create(
        model="tiny",
        messages=messages,
        max_tokens=3,
        metadata={"user_id": "u"},
        extra_body={"context_management": {"edits": []}, "output_config": {"effort": "high"}},
    )
    assert reply.usage.output_tokens >= 1


def errors(server):
    good = {"model": "tiny", "messages": MESSAGES, "max_tokens": 4}
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "x"}}
    return [
        ("invalid_request_error", 400, {"model": "tiny", "messages": MESSAGES}),
        (
            "invalid_request_error",
            400,
            {**good, "messages": [{"role": "user", "content": [image]}]},
        ),
        (
            "invalid_request_error",
            400,
            {**good, "messages": [{"role": "user", "content": "w " * 300}]},
        ),
        ("authentication_error", 401, good),
        ("not_found_error", 404, {**good, "model": "claude-opus-4"}),
        ("request_too_large", 413, "x" * (33 << 20)),
    ]


@pytest.mark.parametrize("case", range(6))
def test_every_error_is_anthropics_shape_and_the_server_goes_on(server, case, caplog):
    caplog.set_level(logging.INFO, logger="macspec.serve")
    kind, status, body = errors(server)[case]
    headers = {"x-api-key": "wrong" if status == 401 else KEY}
    content = body if isinstance(body, str) else None
    reply = httpx.post(
        server.base_url + "/messages",
        json=None if content else body,
        content=content,
        headers=headers,
        timeout=60,
    )
    assert reply.status_code == status, reply.text
    assert reply.json()["type"] == "error" and reply.json()["error"]["type"] == kind
    if status == 400 and "w w" in str(body):
        assert reply.json()["error"]["message"].startswith("prompt is too long")
        # The log line says the status the client got (OpenAI's routes send a 413 for it).
        assert any("/v1/messages 400" in r.getMessage() for r in caplog.records)
    if status == 400 and "image" in str(body):
        assert "images are not supported" in reply.json()["error"]["message"]
    still_answers(server)


def test_the_sdk_raises_its_own_error_types(server):
    api = claude(server)
    with pytest.raises(anthropic.NotFoundError):
        api.messages.create(model="nope", messages=MESSAGES, max_tokens=2)
    with pytest.raises(anthropic.AuthenticationError):
        claude(server, api_key="wrong").messages.create(
            model="tiny", messages=MESSAGES, max_tokens=2
        )
    with pytest.raises(anthropic.BadRequestError):
        api.messages.create(model="tiny", messages=[], max_tokens=2)


def test_a_full_queue_and_a_failed_generation(server, monkeypatch):
    """429 rate_limit_error for a full queue, 500 api_error (or an error event) for a failed
    generation; the server answers afterwards."""
    worker = server.backend.worker
    release = threading.Event()
    original = worker.engine.generate

    def slow(*args, **kwargs):
        release.wait(30)
        return original(*args, **kwargs)

    monkeypatch.setattr(worker, "max_queue", 0)
    monkeypatch.setattr(worker.engine, "generate", slow)
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 2}
    headers = {"x-api-key": KEY}
    first = threading.Thread(
        target=httpx.post,
        args=(server.base_url + "/messages",),
        kwargs={"json": body, "headers": headers, "timeout": 60},
    )
    first.start()
    deadline = threading.Event()
    while not worker.busy and not deadline.wait(0.02):
        pass
    busy = httpx.post(server.base_url + "/messages", json=body, headers=headers, timeout=30)
    assert busy.status_code == 429 and busy.json()["error"]["type"] == "rate_limit_error"
    assert "1 request generating, 0 waiting (--max-queue 0)" in busy.json()["error"]["message"]
    release.set()
    first.join(60)
    monkeypatch.undo()

    def broken(*args, **kwargs):
        raise RuntimeError("simulated")

    monkeypatch.setattr(worker.engine, "generate", broken)
    failed = httpx.post(server.base_url + "/messages", json=body, headers=headers, timeout=30)
    assert failed.status_code == 500 and failed.json()["error"]["type"] == "api_error"
    with pytest.raises(anthropic.APIStatusError):
        with claude(server).messages.stream(model="tiny", messages=MESSAGES, max_tokens=2) as s:
            list(s.text_stream)
    monkeypatch.undo()
    still_answers(server)


def test_max_tokens_beyond_the_context_is_clamped_and_says_so(server, expected):
    reply = claude(server).messages.create(model="tiny", messages=MESSAGES, max_tokens=32000)
    assert reply.stop_reason == "max_tokens"
    assert reply.model_extra["macspec"]["finish_reason"] == "context"
    engine = expected.engine
    config = GenerationConfig(max_tokens=32000, context_length=400)
    want = list(engine.generate(expected.prompt(MESSAGES), config))[-1]
    assert reply.content[0].text == want.text and want.finish_reason == "context"


def test_claude_codes_billing_block_is_not_in_the_prompt(server):
    """Its billing block may change with every request: left in, no prompt would share a
    cached prefix with the one before."""
    api = claude(server)
    system = [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1; cch=1a2b3;"},
        {"type": "text", "text": "Be brief."},
    ]
    with_block = api.messages.count_tokens(model="tiny", system=system, messages=MESSAGES)
    without = api.messages.count_tokens(model="tiny", system="Be brief.", messages=MESSAGES)
    assert with_block.input_tokens == without.input_tokens
