"""`macspec serve --max-batch`: concurrent requests decoded together, each answer exactly the
same request served alone (greedy and seeded), requests joining at staggered times with
different lengths, a client that disconnects mid-batch, and the shared passes reported."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from servekit import KEY, MESSAGES, Expected, client, save_pair

from macspec.engine.core.sampling import SamplingParams
from macspec.engine.generate.loop import GenerationConfig
from macspec.models.catalog import resolve_models
from macspec.models.pairs import open_pair
from macspec.serve.backend import Backend, Defaults
from macspec.serve.server import ServerThread


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return save_pair(tmp_path_factory.mktemp("servebatch"))


@pytest.fixture(scope="module")
def expected(folders):
    return Expected(*folders)


@pytest.fixture(scope="module")
def server(folders):
    opened = open_pair(resolve_models(None, str(folders[0]), str(folders[1])), "3", batch=True)
    backend = Backend(
        opened.engine,
        opened.tokenizer,
        "tiny",
        context_length=400,
        defaults=Defaults(max_tokens=16),
        k=3,
        max_batch=4,
    )
    with ServerThread(backend, api_key=KEY) as running:
        yield running


def conversation(i: int) -> list[dict]:
    return [{"role": "user", "content": f"question number {i}: " + "why? " * (i % 3)}]


def test_concurrent_requests_each_answer_as_alone(server, expected):
    api = client(server, timeout=300)  # six at once on a loaded machine take a while
    # The first runs long enough that the others, staggered, surely join it mid-answer (with
    # short ones all round, a fast machine could finish each before the next arrives).
    lengths = [120, 7, 12, 16, 5, 9]
    answers: dict[int, object] = {}

    def ask(i: int) -> None:
        time.sleep(0.05 * i)  # staggered: they join a batch already running
        answers[i] = api.chat.completions.create(
            model="tiny", messages=conversation(i), max_tokens=lengths[i]
        )

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(lengths))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    for i, length in enumerate(lengths):
        assert answers[i].choices[0].message.content == expected.text(conversation(i), length)
    shared = [answers[i].model_extra["macspec"]["rows_per_pass"] for i in answers]
    assert max(shared) > 1  # some passes carried several requests


def test_seeded_requests_in_a_batch_are_their_seeded_samples(server, expected):
    api = client(server)
    answers: dict[int, str] = {}

    def ask(i: int) -> None:
        reply = api.chat.completions.create(
            model="tiny", messages=conversation(i), max_tokens=10, temperature=0.9, seed=i
        )
        answers[i] = reply.choices[0].message.content

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    for i in range(4):
        config = GenerationConfig(max_tokens=10, sampling=SamplingParams(temperature=0.9), seed=i)
        want = list(expected.engine.generate(expected.prompt(conversation(i)), config))[-1]
        assert answers[i] == want.text


def test_a_client_gone_mid_batch_leaves_the_others_exact(server, expected):
    api = client(server)
    results: dict[int, str] = {}

    def ask(i: int) -> None:
        reply = api.chat.completions.create(model="tiny", messages=conversation(i), max_tokens=16)
        results[i] = reply.choices[0].message.content

    threads = [threading.Thread(target=ask, args=(i,)) for i in (1, 2)]
    for thread in threads:
        thread.start()
    body = {"model": "tiny", "messages": conversation(0), "max_tokens": 200, "stream": True}
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.stream(
        "POST", server.base_url + "/chat/completions", json=body, headers=headers, timeout=60
    ) as reply:
        for i, _ in enumerate(reply.iter_lines()):
            if i > 4:
                break  # the client goes away mid-answer
    for thread in threads:
        thread.join(120)
    for i in (1, 2):
        assert results[i] == expected.text(conversation(i), 16)
    deadline = time.monotonic() + 30
    while server.backend.worker.busy and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not server.backend.worker.busy  # the gone one left the batch
    cancelled = [d for d in server.backend.worker.recent if d.finish_reason == "cancelled"]
    assert cancelled


def test_a_second_turn_reuses_the_first_turns_caches(server, expected):
    api = client(server)
    first = api.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8)
    turn = [
        *MESSAGES,
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "and then?"},
    ]
    second = api.chat.completions.create(model="tiny", messages=turn, max_tokens=8)
    assert second.usage.prompt_tokens_details.cached_tokens > len(expected.prompt(MESSAGES)) // 2
    assert second.choices[0].message.content == expected.text(turn, 8)


def test_a_failed_batched_pass_fails_its_requests_and_the_server_goes_on(server, expected):
    engine = server.backend.engine
    forward = type(engine.model).__call__
    failures = []

    def broken(self, inputs, *args, **kwargs):
        cache = kwargs.get("cache", args[0] if args else None)
        if self is engine.model and cache is engine.caches and not failures:
            failures.append(1)
            raise RuntimeError("simulated")
        return forward(self, inputs, *args, **kwargs)

    type(engine.model).__call__ = broken
    try:
        reply = httpx.post(
            server.base_url + "/chat/completions",
            json={"model": "tiny", "messages": conversation(3), "max_tokens": 6},
            headers={"Authorization": f"Bearer {KEY}"},
            timeout=60,
        )
    finally:
        type(engine.model).__call__ = forward
    assert failures and reply.status_code == 500 and "Traceback" not in reply.text
    again = client(server).chat.completions.create(
        model="tiny", messages=conversation(3), max_tokens=6
    )
    assert again.choices[0].message.content == expected.text(conversation(3), 6)
