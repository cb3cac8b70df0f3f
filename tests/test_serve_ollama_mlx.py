"""What `macspec serve`'s Ollama listings (/api/tags, /api/show) say of Ollama's MLX models, before
and after one loads: format `safetensors` (Ollama's word), the manifest's quantization
(`file_type`), the config's architecture and its chat template; a GGUF beside it stays `gguf`.
A tiny int4 Qwen3 written as Ollama's `x/create` writes it, through the `ollama` SDK."""

from __future__ import annotations

import json
from pathlib import Path

import ollama
import ollamamlxkit
import pytest
from ollamamlxkit import write_model
from storekit import OllamaStore, tiny_gguf
from test_serve_pool import LISTEN
from tiny import CHAT_TEMPLATE, arch_config, arch_model, write_tokenizer

from macspec.cli.serve_pool import make_loader
from macspec.serve.backend import Defaults
from macspec.serve.pool import ModelPool
from macspec.serve.servable import servable_models
from macspec.serve.server import ServerThread

MLX, GGUF = "tiny:int4", "plain:f32"


def template_in_config(folder: Path) -> None:
    """The tokenizer with its chat template inside tokenizer_config.json (as most Hugging Face
    repos keep it, and the JSON files are what Ollama's import keeps)."""
    write_tokenizer(folder)
    config_file = folder / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config["chat_template"] = (folder / "chat_template.jinja").read_text()
    config_file.write_text(json.dumps(config))


@pytest.fixture
def api(tmp_path, monkeypatch):
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "ollama"))
    monkeypatch.setenv("MACSPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("HOME", str(tmp_path))  # no LM Studio store
    monkeypatch.setattr(ollamamlxkit, "write_tokenizer", template_in_config)
    store = OllamaStore(tmp_path / "ollama")
    config = arch_config("qwen3")
    write_model(store, MLX, arch_model("qwen3", 0), config, "int4", tmp_path / "reference")
    store.add(GGUF, tiny_gguf(tmp_path / "plain.gguf"))
    load = make_loader((None, True, None, None), lambda _: Defaults(max_tokens=2), LISTEN)
    with ServerThread(ModelPool(servable_models(), load, keep_alive_s=None)) as server:
        yield ollama.Client(host=server.base_url.removesuffix("/v1"))


def check_mlx(api: ollama.Client) -> None:
    details = {m.model: m.details for m in api.list().models}
    assert details[MLX].format == "safetensors" and details[MLX].quantization_level == "int4"
    assert details[MLX].family == "qwen3"
    assert details[GGUF].format == "gguf"
    shown = api.show(MLX)
    assert (shown.details.format, shown.details.quantization_level) == ("safetensors", "int4")
    assert shown.details.family == "qwen3" and shown.modelinfo["general.architecture"] == "qwen3"
    assert shown.template == CHAT_TEMPLATE


def test_an_mlx_model_is_described_as_ollama_does_before_and_after_it_loads(api):
    check_mlx(api)  # from the manifest alone: nothing loaded
    assert api.ps().models == []
    api.generate(MLX, "Hi", options={"num_predict": 2})
    assert [m.model for m in api.ps().models] == [MLX]
    check_mlx(api)  # from the loaded model, its manifest still saying what it is
