"""An Ollama model's params layer gives run, chat and serve their defaults; flags win. The
commands' heavy work is replaced by a capture: only what they would be handed is checked."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from storekit import OllamaStore, tiny_gguf

from macspec.cli import main

pytestmark = pytest.mark.usefixtures("gguf_as_files")

PARAMS = {"temperature": 0.6, "top_k": 20, "top_p": 0.95, "stop": ["<|im_end|>"], "seed": 7}


@pytest.fixture
def ollama_model(tmp_path: Path) -> str:
    store = OllamaStore(Path(os.environ["HOME"]) / ".ollama" / "models")
    store.add("qwen3:0.6b", tiny_gguf(tmp_path / "tiny.gguf"), params=PARAMS)
    store.add("odd:1b", tiny_gguf(tmp_path / "odd.gguf"), params={"temperature": "hot"})
    store.add("far:1b", tiny_gguf(tmp_path / "far.gguf"), params={"top_p": 3})
    return "qwen3:0.6b"


def run_config(monkeypatch, argv: list[str]):
    seen = []
    monkeypatch.setattr(
        "macspec.cli.run.answer", lambda _t, config, *_a, **_k: seen.append(config) or 0
    )
    assert main(["run", *argv, "hi"]) == 0
    return seen[0]


def test_run_takes_the_params_unless_a_flag_says_otherwise(monkeypatch, ollama_model):
    config = run_config(monkeypatch, ["--model", ollama_model])
    sampling = config.sampling
    assert (sampling.temperature, sampling.top_k, sampling.top_p) == (0.6, 20, 0.95)
    assert config.stop_strings == ("<|im_end|>",) and config.seed == 7
    flagged = run_config(
        monkeypatch, ["--model", ollama_model, "--temp", "0", "--stop", "END", "--seed", "1"]
    )
    assert flagged.sampling.temperature == 0 and flagged.sampling.top_k == 20
    assert flagged.stop_strings == ("END",) and flagged.seed == 1


def test_a_model_folder_keeps_the_flags_defaults(monkeypatch, tiny_model_folder):
    config = run_config(monkeypatch, ["--model", str(tiny_model_folder)])
    assert config.sampling.temperature == 0 and config.stop_strings == ()


def test_serve_defaults_come_from_the_params(monkeypatch, ollama_model):
    seen = []
    monkeypatch.setattr(
        "macspec.cli.serve.serve_models", lambda _r, _d, _w, defaults, *_a: seen.append(defaults)
    )
    assert main(["serve", "--model", ollama_model]) == 0
    assert (seen[0].temperature, seen[0].top_k, seen[0].top_p) == (0.6, 20, 0.95)
    assert (seen[0].stop, seen[0].seed) == (("<|im_end|>",), 7)
    assert main(["serve", "--model", ollama_model, "--top-k", "5"]) == 0
    assert seen[1].top_k == 5 and seen[1].temperature == 0.6


@pytest.mark.parametrize(("name", "needle"), [("odd:1b", "not a number"), ("far:1b", "--top-p")])
def test_bad_params_are_one_line(capsys, ollama_model, name, needle):
    assert main(["run", "--model", name, "hi"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and name in err and "Ollama params" in err and needle in err


def test_serve_applies_the_params_stop_and_seed_to_requests_without_their_own():
    """The defaults reach each request: a request that gives no stop strings or seed gets the
    model's; one that gives its own keeps them."""
    from servekit import DEMO

    from macspec.models.catalog import resolve_models
    from macspec.models.pairs import open_pair
    from macspec.serve.backend import Backend, Defaults
    from macspec.serve.turn import ChatTurn

    opened = open_pair(resolve_models(None, str(DEMO / "target"), None), "1")
    defaults = Defaults(stop=("<|im_end|>",), seed=7)
    backend = Backend(opened.engine, opened.tokenizer, "tiny", defaults=defaults)
    messages = [{"role": "user", "content": "hi"}]
    plain = backend.prepare_turn(ChatTurn(messages=messages)).config
    assert (plain.stop_strings, plain.seed) == (("<|im_end|>",), 7)
    own = backend.prepare_turn(ChatTurn(messages=messages, stop=("END",), seed=1)).config
    assert (own.stop_strings, own.seed) == (("END",), 1)
