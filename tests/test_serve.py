"""`macspec serve` with the real `openai` client: lossless answers, figures, every 4xx, a client
that goes away, 16 concurrent clients, the prompt cache across requests, the API key."""

from __future__ import annotations

import json
import os
import threading
import time

import httpx
import openai
import pytest
from servekit import Expected, make_backend, save_pair

from macspec.cli import main
from macspec.engine.loop import GenerationConfig
from macspec.models.templates import encode_prompt
from macspec.serve.server import ServerThread

KEY = "test-key"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello there"}]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return save_pair(tmp_path_factory.mktemp("serve"))


@pytest.fixture(scope="module")
def expected(folders):
    return Expected(*folders)


@pytest.fixture(scope="module")
def server(folders):
    backend = make_backend(*folders, context_length=400, max_queue=32, prompt_cache_size=4)
    with ServerThread(backend, api_key=KEY) as running:
        yield running


def client(server, **kwargs) -> openai.OpenAI:
    kwargs.setdefault("api_key", KEY)
    return openai.OpenAI(base_url=server.base_url, max_retries=0, timeout=60, **kwargs)


def post(server, path: str, body, key: str | None = KEY, timeout: float = 30) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    data = body if isinstance(body, (str, bytes)) else json.dumps(body)
    return httpx.post(server.base_url + path, content=data, headers=headers, timeout=timeout)


def still_answers(server) -> None:
    reply = client(server).chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2)
    assert reply.choices[0].finish_reason in ("length", "stop")


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
    want = list(expected.engine.generate(prompt_ids, GenerationConfig(10)))[-1].text
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
    ("/chat/completions", {"model": "t", "messages": [{"role": "tool"}]}, 400, "messages.0.role"),
    ("/chat/completions", {"model": "tiny", "messages": MESSAGES, "n": 2}, 400, "n"),
    ("/chat/completions", {"model": "tiny", "messages": MESSAGES, "temperature": -1}, 400, None),
    ("/chat/completions", {"model": "tiny", "messages": MESSAGES, "max_tokens": 0}, 400, None),
    ("/chat/completions", {"model": "tiny", "messages": MESSAGES, "logprobs": True}, 400, None),
    ("/chat/completions", {"model": "tiny", "messages": MESSAGES, "stop": 5}, 400, "stop"),
    ("/chat/completions", {"model": "tiny", "messages": MESSAGES, "stream": "yes"}, 400, "stream"),
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


def test_the_api_key_is_enforced(server):
    for key in (None, "wrong"):
        reply = post(server, "/chat/completions", {"model": "tiny", "messages": MESSAGES}, key)
        assert reply.status_code == 401 and reply.json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        client(server, api_key="wrong").models.list()
    still_answers(server)


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


def test_a_client_that_leaves_the_queue_frees_its_place(server):
    worker = server.backend.worker
    api = client(server)
    long = [{"role": "user", "content": "prompt number 0"}]
    running = api.chat.completions.create(model="tiny", messages=long, max_tokens=300, stream=True)
    next(running)
    waiting = api.chat.completions.create(model="tiny", messages=MESSAGES, stream=True)
    next(waiting)  # the role chunk comes at once; the answer waits for the device
    assert worker.waiting == 1
    waiting.close()
    with pytest.raises(httpx.ReadTimeout):  # a non-streamed request whose client gives up
        post(server, "/chat/completions", {"model": "tiny", "messages": MESSAGES}, timeout=0.5)
    deadline = time.monotonic() + 2
    while worker.waiting and time.monotonic() < deadline:
        time.sleep(0.02)
    assert worker.waiting == 0  # both left the queue without running
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
    assert worker.waiting == 0 and not worker.busy
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
