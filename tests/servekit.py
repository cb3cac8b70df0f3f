"""Helpers for the server's tests: tiny saved models, a backend over them, the expected answers,
and the clients that talk to it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import openai
import pytest
import tiny

import macspec
from macspec.chat.session import open_models
from macspec.engine.core.events import Done
from macspec.engine.generate.loop import Engine, GenerationConfig
from macspec.models.catalog import resolve_models
from macspec.models.pairs import open_pair
from macspec.models.templates import encode_messages
from macspec.serve.backend import Backend, Defaults
from macspec.serve.server import ServerThread

DEMO = Path(macspec.__file__).parent / "demo"
"""The shipped demo pair."""
KEY = "test-key"
"""The API key of the test servers."""
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello there"}]


def client(server, **kwargs) -> openai.OpenAI:
    kwargs.setdefault("api_key", KEY)
    kwargs.setdefault("timeout", 60)
    return openai.OpenAI(base_url=server.base_url, max_retries=0, **kwargs)


def post(server, path: str, body, key: str | None = KEY, timeout: float = 30) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    data = body if isinstance(body, (str, bytes)) else json.dumps(body)
    return httpx.post(server.base_url + path, content=data, headers=headers, timeout=timeout)


def still_answers(server) -> None:
    reply = client(server).chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2)
    assert reply.choices[0].finish_reason in ("length", "stop")


def save_pair(root: Path) -> tuple[Path, Path]:
    """A tiny float32 target and a noisy copy as its draft, saved as mlx-lm folders."""
    target = tiny.random_model(0, scale=3.0)
    return (
        tiny.save_model(target, root / "target"),
        tiny.save_model(tiny.noisy_copy(target, 0.01, seed=1), root / "draft"),
    )


def load_engine(target: Path, draft: Path, k: str = "3"):
    """The engine `macspec serve --model T --draft-model D -k K` builds, and its tokenizer."""
    loaded = open_models(resolve_models(None, str(target), str(draft)), k)
    return loaded.engine, loaded.tokenizer


def make_backend(target: Path, draft: Path, **kwargs) -> Backend:
    engine, tokenizer = load_engine(target, draft)
    kwargs.setdefault("defaults", Defaults(max_tokens=16))
    return Backend(engine, tokenizer, "tiny", aliases=(str(target),), k=3, **kwargs)


def save_tool_pair(root: Path) -> tuple[Path, Path]:
    """The tool model (tests/toolkit.py) and its draft, saved under `root`."""
    from toolkit import save_tool_draft, save_tool_model

    return save_tool_model(root / "target"), save_tool_draft(root / "draft")


def tool_backend(folders: tuple[Path, Path], **kwargs) -> Backend:
    """The tool model (tests/toolkit.py) drafted by its draft, served as 'tool-model'."""
    loaded = open_models(resolve_models(None, str(folders[0]), str(folders[1])), "3")
    kwargs.setdefault("defaults", Defaults(max_tokens=64))
    return Backend(loaded.engine, loaded.tokenizer, "tool-model", **kwargs)


class Expected:
    """Greedy answers from an engine of its own: what the server must send back."""

    def __init__(self, target: Path, draft: Path):
        self.engine, self.tokenizer = load_engine(target, draft)

    def prompt(self, messages: list[dict[str, str]]) -> list[int]:
        return encode_messages(self.tokenizer, messages)

    def done(self, messages: list[dict[str, str]], max_tokens: int) -> Done:
        events = self.engine.generate(self.prompt(messages), GenerationConfig(max_tokens))
        return list(events)[-1]

    def text(self, messages: list[dict[str, str]], max_tokens: int) -> str:
        return self.done(messages, max_tokens).text


def fresh_answer(engine: Engine, prompt: list[int], max_tokens: int) -> Done:
    return list(engine.generate(prompt, GenerationConfig(max_tokens)))[-1]


def served_pair_fixtures():
    """Module-scoped fixtures `folders` (a saved tiny pair), `expected` (its answers, from an
    engine of its own) and `server` (a ServerThread over it, with the API key KEY), for
    `folders, expected, server = served_pair_fixtures()` at a test module's top."""

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

    return folders, expected, server


@contextmanager
def demo_server(
    k: str, max_tokens: int, max_batch: int = 1, draft: str | None = None,
    api_key: str | None = KEY, model_id: str = "tiny", **backend,
) -> Iterator[ServerThread]:  # fmt: skip
    """`macspec serve -k K --max-batch N [--draft D]` over the shipped demo pair, as the command
    builds it (the batching engine past one row), answering `max_tokens` when a request does
    not say."""
    resolved = resolve_models(None, str(DEMO / "target"), str(DEMO / "draft"))
    opened = open_pair(resolved, k, draft=draft, batch=max_batch > 1)
    defaults = Defaults(max_tokens=max_tokens)
    served = Backend(opened.engine, opened.tokenizer, model_id, defaults=defaults, k=int(k),
                     max_batch=max_batch, **backend)  # fmt: skip
    with ServerThread(served, api_key=api_key) as running:
        yield running
