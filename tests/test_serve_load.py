"""`macspec serve` under load: a client that goes away, 16 concurrent clients, a full queue, the
prompt cache across requests."""

from __future__ import annotations

import os
import threading
import time

import httpx
import pytest
from servekit import (
    MESSAGES,
    client,
    post,
    served_pair_fixtures,
    still_answers,
)

folders, expected, server = served_pair_fixtures()


def settles(condition, within: float = 2.0) -> bool:
    """Whether `condition()` holds within `within` seconds (polled)."""
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


# -- a client that goes away -----------------------------------------------------------------
def test_a_client_that_disconnects_mid_stream_cancels_its_generation(server):
    worker = server.backend.worker
    messages = [{"role": "user", "content": "prompt number 0"}]
    stream = client(server).chat.completions.create(
        model="tiny", messages=messages, max_tokens=300, stream=True
    )
    for _ in range(4):
        next(stream)
    stream.close()
    started = time.perf_counter()
    reply = client(server).chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2)
    waited = time.perf_counter() - started
    assert reply.choices[0].message.content is not None
    cancelled = worker.recent[-2]
    assert cancelled.finish_reason == "cancelled" and len(cancelled.tokens) < 100
    assert waited < 2.0  # the 300-token answer was not finished first


def test_a_client_that_leaves_the_queue_frees_its_place(server, monkeypatch):
    worker = server.backend.worker
    # The running answer holds the device after the engine's first event until the test lets
    # it go: a tiny model's 300 tokens could otherwise end before the queued clients leave.
    release = threading.Event()
    generate = worker.engine.generate

    def held(prompt, config, cancelled):
        for i, event in enumerate(generate(prompt, config, cancelled=cancelled)):
            yield event
            while i == 0 and not (release.wait(0.01) or cancelled()):
                pass

    monkeypatch.setattr(worker.engine, "generate", held)
    api = client(server)
    long = [{"role": "user", "content": "prompt number 0"}]
    running = api.chat.completions.create(model="tiny", messages=long, max_tokens=300, stream=True)
    try:
        next(running)
        waiting = api.chat.completions.create(model="tiny", messages=MESSAGES, stream=True)
        next(waiting)  # the role chunk comes at once; the answer waits for the device
        assert worker.waiting == 1
        waiting.close()
        with pytest.raises(httpx.ReadTimeout):  # a non-streamed request whose client gives up
            post(server, "/chat/completions", {"model": "tiny", "messages": MESSAGES}, timeout=0.5)
        assert settles(lambda: worker.waiting == 0)  # both left the queue without running
    finally:  # a failure here must not leave the device held for the module's other tests
        release.set()
        running.close()


# -- load: 16 clients x 4 turns, none lost or mixed up; 429 when the queue is small ---------------
def rss_bytes() -> int:
    """This process's resident memory (Linux; 0 where /proc is missing)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def test_sixteen_concurrent_clients_four_turns_each(server, expected):
    clients, turns, max_tokens = 16, 4, 8
    # What each conversation must read, computed by an engine of its own, turn by turn.
    want: dict[int, list[str]] = {}
    for i in range(clients):
        history, want[i] = [], []
        for j in range(turns):
            history.append({"role": "user", "content": f"client {i} turn {j}"})
            want[i].append(expected.text(history, max_tokens))
            history.append({"role": "assistant", "content": want[i][-1]})

    got: dict[int, list[str]] = {i: [] for i in range(clients)}
    errors: list[BaseException] = []
    start = threading.Barrier(clients)

    def converse(i: int) -> None:
        api = client(server)
        history: list[dict[str, str]] = []
        start.wait()
        try:
            for j in range(turns):
                history.append({"role": "user", "content": f"client {i} turn {j}"})
                if j % 2:
                    parts = api.chat.completions.create(
                        model="tiny", messages=history, max_tokens=max_tokens, stream=True
                    )
                    text = "".join(c.choices[0].delta.content or "" for c in parts if c.choices)
                else:
                    reply = api.chat.completions.create(
                        model="tiny", messages=history, max_tokens=max_tokens
                    )
                    text = reply.choices[0].message.content
                got[i].append(text)
                history.append({"role": "assistant", "content": text})
        except BaseException as exc:  # reported below, with the others
            errors.append(exc)

    before = rss_bytes()
    began = time.perf_counter()
    threads = [threading.Thread(target=converse, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    elapsed = time.perf_counter() - began
    assert errors == []
    assert got == want
    worker = server.backend.worker
    # The worker thread frees itself just after posting the last answer's end.
    assert settles(lambda: worker.waiting == 0 and not worker.busy)
    assert len(worker.prompt_cache.entries) <= worker.prompt_cache.size
    grown = rss_bytes() - before
    print(f"\nload: {clients * turns} requests in {elapsed:.2f}s, rss +{grown / 2**20:.1f} MiB")
    assert grown < 200 * 2**20


def test_a_small_queue_refuses_with_429(server, expected):
    worker = server.backend.worker
    worker.max_queue = 1
    replies: dict[int, httpx.Response] = {}
    start = threading.Barrier(12)

    def one(i: int) -> None:
        start.wait()
        body = {"model": "tiny", "messages": [{"role": "user", "content": f"q{i}"}]}
        replies[i] = post(server, "/chat/completions", {**body, "max_tokens": 30})

    try:
        threads = [threading.Thread(target=one, args=(i,)) for i in range(12)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    finally:
        worker.max_queue = 32
    assert len(replies) == 12 and {r.status_code for r in replies.values()} == {200, 429}
    for i, reply in replies.items():  # the engine of the expected answers stays on this thread
        if reply.status_code == 429:
            assert reply.json()["error"]["type"] == "rate_limit_error"
        else:
            want = expected.text([{"role": "user", "content": f"q{i}"}], 30)
            assert reply.json()["choices"][0]["message"]["content"] == want
    still_answers(server)


# -- the prompt cache across requests --------------------------------------------------------
def test_a_second_turn_prefills_only_its_new_tokens(server, expected):
    api = client(server)
    first = [{"role": "user", "content": "remember the number 42"}]
    other = [{"role": "user", "content": "an unrelated conversation in between"}]

    def ask(messages):
        reply = api.chat.completions.create(model="tiny", messages=messages, max_tokens=12)
        return reply.choices[0].message.content, reply.usage, reply.model_extra["macspec"]

    answer, usage1, _ = ask(first)
    ask(other)  # another client's turn moves the live caches elsewhere
    second = [*first, {"role": "assistant", "content": answer}, {"role": "user", "content": "and?"}]
    _, usage2, figures = ask(second)

    # The reference: one engine that saw this conversation's first turn just before.
    expected.done(first, 12)
    reference = expected.done(second, 12).stats.prefilled_tokens
    assert figures["prefilled_tokens"] == reference
    new_tokens = usage2.prompt_tokens - usage1.prompt_tokens
    assert figures["prefilled_tokens"] <= new_tokens
    assert usage2.prompt_tokens_details.cached_tokens == usage2.prompt_tokens - reference

    # Without the saved caches, the turn in between costs the whole prefix again.
    cache = server.backend.worker.prompt_cache
    cache.size, size = 0, cache.size
    try:
        ask(first)
        ask(other)
        _, _, cold = ask(second)
    finally:
        cache.size = size
    assert cold["prefilled_tokens"] > usage1.prompt_tokens
