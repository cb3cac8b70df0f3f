"""Every route accepts every name any route lists: `serve --model DIR/NAME.gguf` and `serve
--model smollm2` (an Ollama store name) answer /v1/models' NAME, /api/tags' NAME:latest, the name
given, and an Ollama model's name with and without `ollama:`; a split GGUF is listed by the
model's name, not its part's."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from ggufkit import tiny_gguf
from servekit import load_engine, save_pair
from storekit import OllamaStore

from macspec.cli.serve import served_names
from macspec.models.catalog import resolve_models
from macspec.serve.backend import Backend
from macspec.serve.errors import APIError
from macspec.serve.ollama_models import ServedModel


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return load_engine(*save_pair(tmp_path_factory.mktemp("pair")))


@pytest.fixture(scope="module")
def gguf(tmp_path_factory) -> Path:
    return tiny_gguf(tmp_path_factory.mktemp("gguf"))


def serve(engine, model: str) -> Backend:
    """The backend `macspec serve --model MODEL` builds (over a tiny engine)."""
    model_id, aliases = served_names(resolve_models(None, model, None))
    return Backend(*engine, model_id, aliases=aliases)


def accepts_everywhere(backend: Backend, names: list[str]) -> None:
    served = ServedModel(backend)
    listed = [backend.model_id, served.name]  # /v1/models, /api/tags
    for name in [*listed, *names]:
        backend.check_model(name)  # the OpenAI, Anthropic and Responses routes
        served.check(name)  # Ollama's routes
    for other in ("other", "other:latest"):
        with pytest.raises(APIError):
            backend.check_model(other)
        with pytest.raises(APIError):
            served.check(other)


def test_a_gguf_path_is_answered_by_each_listed_name(engine, gguf):
    backend = serve(engine, str(gguf))
    assert backend.model_id == gguf.stem
    assert ServedModel(backend).name == f"{gguf.stem}:latest"
    accepts_everywhere(backend, [str(gguf), f"{gguf.stem}:latest", gguf.stem])


def test_an_ollama_name_is_answered_tagged_and_untagged_with_and_without_prefix(
    engine, gguf, tmp_path, monkeypatch
):
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "ollama"))
    OllamaStore(tmp_path / "ollama").add("smollm2:latest", model=gguf)
    forms = ["smollm2", "smollm2:latest", "ollama:smollm2", "ollama:smollm2:latest"]
    for given in forms:
        backend = serve(engine, given)
        assert ServedModel(backend).name == "smollm2:latest"
        accepts_everywhere(backend, forms)


def test_a_split_gguf_is_listed_by_the_models_name(tmp_path):
    part = tmp_path / "gem-00002-of-00003.gguf"
    resolved = SimpleNamespace(target_name=str(part), target=tmp_path / "converted", pair=None)
    model_id, aliases = served_names(resolved)
    assert model_id == "gem" and str(part) in aliases
