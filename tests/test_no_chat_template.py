"""A model with no chat template (a base model): run warns once that the prompt is fed raw,
and the server's chat routes refuse it, each pointing to its own plain-text route."""

from __future__ import annotations

import httpx
import pytest
import tiny
from servekit import make_backend, post

from macspec.cli import main
from macspec.serve.server import ServerThread


@pytest.fixture(scope="module")
def base_pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("base")
    target = tiny.random_model(0, scale=3.0)
    return (
        tiny.save_model(target, root / "target", chat_template=False),
        tiny.save_model(tiny.noisy_copy(target, 0.01, seed=1), root / "draft", chat_template=False),
    )


def test_run_warns_in_one_line_that_the_prompt_goes_raw(base_pair, capsys):
    assert main(["run", "--model", str(base_pair[0]), "--no-draft", "--max-tokens", "2", "hi"]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert warnings == [
        "macspec: warning: the model has no chat template: the prompt is fed raw (as with --raw)"
    ]
    args = ["run", "--model", str(base_pair[0]), "--no-draft", "--max-tokens", "2", "--raw", "hi"]
    assert main(args) == 0
    assert "warning" not in capsys.readouterr().err  # --raw asked for it: nothing to say


def test_each_chat_route_points_to_its_own_plain_text_route(base_pair):
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": False}
    with ServerThread(make_backend(*base_pair), api_key="test-key") as server:
        ollama = server.base_url.removesuffix("/v1")
        refused = post(server, "/chat/completions", chat)
        assert refused.status_code == 400 and "/v1/completions" in refused.text
        refused = httpx.post(
            ollama + "/api/chat", json=chat, headers={"Authorization": "Bearer test-key"}
        )
        assert refused.status_code == 400
        assert "use /api/generate" in refused.json()["error"]
        answered = httpx.post(
            ollama + "/api/generate",
            json={"model": "tiny", "prompt": "hi", "stream": False, "options": {"num_predict": 2}},
            headers={"Authorization": "Bearer test-key"},
        )
        assert answered.status_code == 200 and answered.json()["done"]


def test_serve_warns_at_start_up_which_routes_work(base_pair, capsys, monkeypatch):
    started = []
    monkeypatch.setattr("macspec.serve.server.run_server", lambda *a, **k: started.append(1))
    assert main(["serve", "--model", str(base_pair[0]), "--no-draft", "--port", "0"]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert started == [1] and len(warnings) == 1
    assert warnings[0].startswith("macspec: warning: the model has no chat template")
    assert "/v1/chat/completions" in warnings[0] and "/api/chat" in warnings[0]
    assert "/v1/completions and /api/generate work" in warnings[0]
