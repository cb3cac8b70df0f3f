"""OpenAI's Responses API with the real `openai` client: whole and streamed answers equal to
greedy decoding, the event sequence, usage, and previous_response_id (tool calls through it:
test_serve_tools.py)."""

from __future__ import annotations

import logging

import httpx
import openai
import pytest
from servekit import KEY, client, served_pair_fixtures, still_answers

folders, expected, server = served_pair_fixtures()
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello there"}]


def test_create_and_stream_answer_as_greedy_decoding_does(server, expected):
    want = expected.done(CHAT, 12)
    api = client(server)
    whole = api.responses.create(
        model="tiny", instructions="Be brief.", input="hello there", max_output_tokens=12
    )
    assert whole.output_text == want.text
    assert whole.status == ("incomplete" if want.finish_reason == "length" else "completed")
    assert whole.output[-1].status == whole.status  # the message, cut by the limit or not
    assert whole.usage.input_tokens == len(expected.prompt(CHAT))
    assert whole.usage.output_tokens == len(want.tokens) + want.stats.end_tokens
    events = list(
        api.responses.create(
            model="tiny",
            input=[
                {"role": "developer", "content": "Be brief."},
                {"role": "user", "content": [{"type": "input_text", "text": "hello there"}]},
            ],
            max_output_tokens=12,
            stream=True,
        )
    )
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == f"response.{whole.status}"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == want.text
    done = next(e for e in events if e.type == "response.output_text.done")
    assert done.text == want.text
    last = events[-1].response
    assert last.output[0].content[0].text == want.text
    assert last.output[0].status == whole.status
    assert last.usage.input_tokens_details.cached_tokens > 0  # the same prompt, again
    order = [k for k in kinds if "output_item" in k or "content_part" in k]
    assert order == [
        "response.output_item.added",
        "response.content_part.added",
        "response.content_part.done",
        "response.output_item.done",
    ]


def test_a_kept_response_continues_and_an_unknown_one_is_a_400(server, expected):
    api = client(server)
    first = api.responses.create(model="tiny", input="hello there", max_output_tokens=6)
    second = api.responses.create(
        model="tiny", input="and more", previous_response_id=first.id, max_output_tokens=6
    )
    history = [
        {"role": "user", "content": "hello there"},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "and more"},
    ]
    assert second.output_text == expected.text(history, 6)
    with pytest.raises(openai.BadRequestError) as error:
        api.responses.create(model="tiny", input="x", previous_response_id="resp_nope")
    assert "previous_response_id" in str(error.value)
    still_answers(server)


def test_unknown_fields_are_accepted_and_bad_items_are_400s(server, caplog):
    caplog.set_level(logging.INFO, logger="macspec.serve")
    body = {
        "model": "tiny",
        "input": "hello there",
        "max_output_tokens": 3,
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "k",
        "reasoning": {"effort": "minimal", "summary": "auto"},
        "tools": [{"type": "web_search"}],
        "text": {"verbosity": "low"},
    }
    url = server.base_url + "/responses"
    headers = {"Authorization": f"Bearer {KEY}"}
    assert httpx.post(url, json=body, headers=headers, timeout=30).status_code == 200
    assert httpx.post(url, json=body, headers=headers, timeout=30).status_code == 200
    said = [r for r in caplog.records if "'web_search' is not a function" in r.getMessage()]
    assert len(said) <= 1  # once per server (an earlier test may have said it already)
    image = {"type": "input_image", "image_url": "data:x"}
    for bad in (
        [{"role": "user", "content": [image]}],
        [{"type": "computer_call", "call_id": "1"}],
        [{"role": "robot", "content": "x"}],
    ):
        reply = httpx.post(url, json={**body, "input": bad}, headers=headers, timeout=30)
        assert reply.status_code == 400 and reply.json()["error"]["message"]
    unknown = {"type": "grammar", "grammar": "start: 'a'"}  # a format this server cannot hold
    for field, value in (("text", {"format": unknown}), ("background", True)):
        reply = httpx.post(url, json={**body, field: value}, headers=headers, timeout=30)
        assert reply.status_code == 400, reply.text
        assert reply.json()["error"]["param"] == ("text.format" if field == "text" else field)
    reply = httpx.post(url, json={**body, "text": {"format": {"type": "text"}}}, headers=headers)
    assert reply.status_code == 200
    still_answers(server)
