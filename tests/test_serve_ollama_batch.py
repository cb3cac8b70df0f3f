"""Ollama's clients on the batching server (`macspec serve`'s default, here --max-batch 4) on
the demo pair: several at once, each answer the target alone's greedy one (mlx-lm); a client
that goes away mid-stream cancels its generation and leaves the batch."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import mlx_lm
import ollama
import pytest
from losslesskit import reference
from servekit import demo_server

import macspec
from macspec.models.templates import encode_messages

DEMO = Path(macspec.__file__).parent / "demo"
TOPICS = ["adds two numbers", "reverses a list", "counts words", "reads a file"]


def conversation(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Write a function that {TOPICS[i]}."}]


@pytest.fixture(scope="module")
def server():
    with demo_server("3", 16, max_batch=4, api_key=None, model_id="demo", context_length=512) as r:
        yield r


def base(server) -> str:
    return server.base_url.removesuffix("/v1")


def test_clients_at_once_each_get_the_answer_they_would_alone(server):
    model, tokenizer = mlx_lm.load(str(DEMO / "target"))
    eos = frozenset(tokenizer.eos_token_ids)
    wants = [
        tokenizer.decode(reference(model, encode_messages(tokenizer, conversation(i)), 16, eos))
        for i in range(4)
    ]
    results: dict[int, str] = {}

    def ask(i: int) -> None:
        parts = ollama.Client(host=base(server)).chat(
            model="demo", messages=conversation(i), stream=i % 2 == 0
        )
        if i % 2 == 0:
            results[i] = "".join(p.message.content for p in parts)
        else:
            results[i] = parts.message.content

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert [results.get(i) for i in range(4)] == wants
    recent = list(server.backend.worker.recent)[-4:]
    assert max(d.stats.rows_per_pass or 1 for d in recent) > 1  # they shared passes


def test_a_client_that_goes_away_cancels_its_generation(server):
    body = {"model": "demo", "messages": conversation(0), "options": {"num_predict": 400}}
    with httpx.stream("POST", base(server) + "/api/chat", json=body, timeout=60) as reply:
        assert reply.headers["content-type"] == "application/x-ndjson"
        for i, _ in enumerate(reply.iter_lines()):
            if i > 3:
                break  # the client goes away mid-answer
    worker = server.backend.worker
    deadline = time.monotonic() + 30
    while worker.busy and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not worker.busy
    cancelled = worker.recent[-1]
    assert cancelled.finish_reason == "cancelled" and len(cancelled.tokens) < 400
