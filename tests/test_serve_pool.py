"""`macspec serve` without `--model`, over a test Ollama store of two real models (SmolLM2-135M's
GGUF, with a chat template, and Gemma 3 270M's, without): both listed before either loads, each
loaded when a request first names it and answering what that model alone answers, /api/ps before
and after, keep_alive 0, a budget of one model, unknown names and a model too big to load, with
the `ollama` and `openai` SDKs. Each model is read from its GGUF once for the module (then its
derived folder is reused), so a load here is the weights alone."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import ollama
import openai
import pytest
from ggufkit import smollm2_path
from kquantkit import gemma_q4_k_m
from storekit import OllamaStore

from macspec.cli.serve_pool import make_loader
from macspec.engine.generate.loop import GenerationConfig
from macspec.models.catalog import resolve_models
from macspec.models.pairs import open_pair
from macspec.models.templates import encode_messages, encode_prompt
from macspec.serve.backend import Defaults
from macspec.serve.ollama_models import FOREVER
from macspec.serve.pool import ModelPool
from macspec.serve.servable import servable_models
from macspec.serve.server import ServerThread

SMOL, GEMMA = "smollm2:latest", "gemma3:270m"
TOKENS = 4
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
PROMPT = "The capital of France is"
LISTEN = ("127.0.0.1", 0, None, 32, 4, False, 8, None)
"""`serve`'s host, port, key, --max-queue, --prompt-cache, --any-model, --max-batch, context."""


@pytest.fixture(scope="module")
def store_env(tmp_path_factory) -> dict[str, str]:
    """An Ollama store holding both models, and a macspec home of the module's own."""
    root = tmp_path_factory.mktemp("pool")
    store = OllamaStore(root / "ollama")
    store.add(SMOL, model=smollm2_path())
    store.add(GEMMA, model=gemma_q4_k_m(root))
    return {
        "OLLAMA_MODELS": str(root / "ollama"),
        "MACSPEC_HOME": str(root / "home"),
        "HOME": str(root / "user"),
        "HF_HOME": str(root / "hf"),
    }


@pytest.fixture(autouse=True)
def in_store(store_env, monkeypatch):
    """Every test (and the loads it causes) sees the module's store and home."""
    for name, value in store_env.items():
        monkeypatch.setenv(name, value)


@pytest.fixture(scope="module")
def expected(store_env) -> dict[str, str]:
    """What each model alone answers (`macspec run --model NAME --no-draft`, greedy)."""
    answers = {}
    with pytest.MonkeyPatch.context() as patch:
        for name, value in store_env.items():
            patch.setenv(name, value)
        for model in (SMOL, GEMMA):
            opened = open_pair(resolve_models(None, model, None, need_draft=False), None, True)
            tok = opened.tokenizer
            prompt = encode_messages(tok, MESSAGES) if model == SMOL else None
            prompt = prompt or encode_prompt(tok, PROMPT, raw=True)
            events = opened.engine.generate(prompt, GenerationConfig(TOKENS))
            answers[model] = list(events)[-1].text
    return answers


class CountedLoads:
    """The command's loader, counting loads by model."""

    def __init__(self):
        defaults = Defaults(max_tokens=TOKENS)
        self.load = make_loader((None, False, "auto", None), lambda _: defaults, LISTEN)
        self.count: dict[str, int] = {}
        self.lock = threading.Lock()

    def __call__(self, servable):
        with self.lock:
            self.count[servable.model_id] = self.count.get(servable.model_id, 0) + 1
        return self.load(servable)


def pool_server(**limits) -> tuple[ServerThread, CountedLoads]:
    loads = CountedLoads()
    pool = ModelPool(servable_models(), loads, **limits)
    return ServerThread(pool), loads


@pytest.fixture(scope="module")
def served(store_env, expected):
    with pytest.MonkeyPatch.context() as patch:
        for name, value in store_env.items():
            patch.setenv(name, value)
        server, loads = pool_server(keep_alive_s=None)
    with server:
        yield server, loads


def clients(server: ServerThread) -> tuple[ollama.Client, openai.OpenAI]:
    host = server.base_url.removesuffix("/v1")
    return ollama.Client(host=host), openai.OpenAI(
        base_url=server.base_url, api_key="none", max_retries=0
    )


def loaded(api: ollama.Client) -> list[str]:
    return [m.model for m in api.ps().models]


def test_every_model_is_listed_and_described_before_any_loads(served):
    api, oa = clients(served[0])
    assert {SMOL, GEMMA} <= {m.model for m in api.list().models}
    assert {SMOL, GEMMA} <= {m.id for m in oa.models.list().data}
    assert loaded(api) == []
    gemma = api.show(GEMMA)
    assert gemma.details.family == "gemma3" and gemma.details.quantization_level == "Q4_K_M"
    assert gemma.modelinfo["gemma3.context_length"] == 32768
    assert "<|im_start|>" in api.show("smollm2").template
    assert loaded(api) == [] and served[1].count == {}


def test_concurrent_first_requests_load_once_and_answer_as_the_model_alone(served, expected):
    server, loads = served
    api, oa = clients(server)
    with ThreadPoolExecutor(3) as threads:
        names = (SMOL, "smollm2", "ollama:smollm2")  # one model, by three of its names
        replies = list(threads.map(lambda n: api.chat(n, MESSAGES, stream=False), names))
    assert loads.count == {SMOL: 1}
    assert [r.message.content for r in replies] == [expected[SMOL]] * 3
    assert all(r.load_duration > 10**8 for r in replies)  # Ollama's: the wait for the load
    reply = oa.completions.create(model=GEMMA, prompt=PROMPT, max_tokens=TOKENS)
    assert reply.choices[0].text == expected[GEMMA]
    running = {m.model: m for m in api.ps().models}
    assert set(running) == {SMOL, GEMMA}
    assert all(m.size > 0 and m.size_vram == m.size for m in running.values())
    assert running[GEMMA].expires_at.year == int(FOREVER[:4])  # keep_alive -1: kept


def test_keep_alive_0_unloads_the_model_once_answered(served, expected):
    api, _ = clients(served[0])
    answer = api.generate(GEMMA, PROMPT, options={"num_predict": TOKENS}, keep_alive=0)
    assert answer.response == expected[GEMMA]
    deadline = time.monotonic() + 10
    while GEMMA in loaded(api) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert loaded(api) == [SMOL]


def test_an_unknown_name_is_each_apis_404(served):
    api, oa = clients(served[0])
    with pytest.raises(ollama.ResponseError) as error:
        api.chat("nothing:here", MESSAGES)
    assert error.value.status_code == 404 and error.value.error == "model 'nothing:here' not found"
    with pytest.raises(openai.NotFoundError) as missing:
        oa.chat.completions.create(model="nothing", messages=MESSAGES)
    assert missing.value.body["code"] == "model_not_found"


def test_a_budget_of_one_model_swaps_them(expected):
    server, loads = pool_server(max_loaded=1)
    with server:
        api, oa = clients(server)
        assert (
            api.generate(GEMMA, PROMPT, options={"num_predict": TOKENS}).response
            == (expected[GEMMA])
        )
        assert loaded(api) == [GEMMA]
        reply = oa.chat.completions.create(model=SMOL, messages=MESSAGES, max_tokens=TOKENS)
        assert reply.choices[0].message.content == expected[SMOL]
        assert loaded(api) == [SMOL]
    assert loads.count == {GEMMA: 1, SMOL: 1}


def test_a_model_too_big_for_the_budget_is_ollamas_500_and_nothing_loads():
    server, loads = pool_server(budget_bytes=10**6)
    with server:
        api, oa = clients(server)
        with pytest.raises(ollama.ResponseError) as error:
            api.chat(SMOL, MESSAGES)
        assert error.value.status_code == 500
        assert error.value.error.startswith("model requires more system memory (0.4 GiB)")
        assert error.value.error.endswith("than is available (0.0 GiB)")
        with pytest.raises(openai.InternalServerError):
            oa.chat.completions.create(model=SMOL, messages=MESSAGES)
    assert loads.count == {}
