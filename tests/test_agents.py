"""The real agent CLIs from npm against `macspec serve`, each through one whole tool round
trip: Claude Code (Anthropic Messages), Codex CLI (Responses) and opencode (chat completions
with tools). The tiny tool model (tests/toolkit.py) calls a read-only shell tool of the agent's
own; the agent runs it and sends its result back; the model then answers "Done.".

They need Node (20 here) and the npm registry; without `node` and `npm` they are skipped, with
the reason. The CLIs are installed once into ~/.cache/macspec/test-agents (pinned versions).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from toolkit import AGENT_CALLS, save_tool_draft, save_tool_model

from macspec.models.catalog import resolve_models
from macspec.models.pairs import open_pair
from macspec.serve.backend import Backend, Defaults
from macspec.serve.server import ServerThread

CLIS = {
    "claude_code": "@anthropic-ai/claude-code@2.1.332",
    "codex": "@openai/codex@0.171.0",
    "opencode": "opencode-ai@1.18.33",
}
MODEL = "macspec-agent"
PROMPT = "List the files in this folder."

pytestmark = pytest.mark.skipif(
    shutil.which("node") is None or shutil.which("npm") is None,
    reason="the agent CLIs need node and npm",
)


@pytest.fixture(scope="module")
def bin_dir() -> Path:
    root = Path(os.environ.get("MACSPEC_TEST_AGENTS", Path.home() / ".cache/macspec/test-agents"))
    stamp = root / "installed.json"
    if not stamp.is_file() or json.loads(stamp.read_text()) != CLIS:
        root.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["npm", "install", "--prefix", str(root), "--no-audit", "--no-fund", *CLIS.values()],
            check=True,
            capture_output=True,
            timeout=600,
        )
        stamp.write_text(json.dumps(CLIS))
    return root / "node_modules" / ".bin"


class Recording(Backend):
    """A backend that notes every conversation it renders."""

    turns: list

    def prepare_turn(self, turn):
        self.turns.append(turn)
        return super().prepare_turn(turn)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("agents")
    target, draft = save_tool_model(root / "target"), save_tool_draft(root / "draft")
    opened = open_pair(
        resolve_models(None, str(target), str(draft)), None, draft="auto", batch=True
    )
    backend = Recording(
        opened.engine,
        opened.tokenizer,
        MODEL,
        context_length=32768,
        defaults=Defaults(max_tokens=64),
        any_model=True,
        max_batch=4,
    )
    backend.turns = []
    with ServerThread(backend) as running:
        yield running


def workspace(tmp_path: Path) -> tuple[Path, Path]:
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    (work / "notes.txt").write_text("hello\n")
    return home, work


def command(name: str, bin_dir: Path, home: Path, url: str) -> tuple[list[str], dict]:
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "LANG": "C.UTF-8"}
    if name == "claude_code":
        argv = [str(bin_dir / "claude"), "-p", PROMPT, "--output-format", "stream-json"]
        argv.append("--verbose")
        env |= {"ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": "x", "ANTHROPIC_MODEL": MODEL}
        return argv, env
    if name == "codex":
        codex_home = home / ".codex"
        codex_home.mkdir()
        (codex_home / "config.toml").write_text(
            f'model = "{MODEL}"\nmodel_provider = "macspec"\n\n'
            f'[model_providers.macspec]\nname = "macspec"\nbase_url = "{url}/v1"\n'
            'wire_api = "responses"\n'
        )
        argv = [str(bin_dir / "codex"), "exec", "--skip-git-repo-check", PROMPT]
        return argv, env | {"CODEX_HOME": str(codex_home)}
    config_dir = home / ".config" / "opencode"
    config_dir.mkdir(parents=True)
    provider = {
        "npm": "@ai-sdk/openai-compatible",
        "name": "macspec",
        "options": {"baseURL": f"{url}/v1", "apiKey": "x"},
        "models": {MODEL: {"name": MODEL}},
    }
    config = {"provider": {"macspec": provider}, "model": f"macspec/{MODEL}"}
    (config_dir / "opencode.json").write_text(json.dumps(config))
    return [str(bin_dir / "opencode"), "run", PROMPT], env


@pytest.mark.parametrize("name", list(CLIS))
def test_a_whole_tool_round_trip(name, bin_dir, server, tmp_path):
    home, work = workspace(tmp_path)
    url = server.base_url.removesuffix("/v1")
    argv, env = command(name, bin_dir, home, url)
    turns = server.backend.turns
    seen = len(turns)
    run = subprocess.run(
        argv, cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    report = f"exit {run.returncode}\nstdout: {run.stdout[-2000:]}\nstderr: {run.stderr[-2000:]}"
    mine = turns[seen:]
    tool_name, _ = AGENT_CALLS[name]
    offered = [t for t in mine if any(f["function"]["name"] == tool_name for f in t.tools)]
    assert offered, f"{name} never offered {tool_name}\n{report}"
    results = [
        m for t in mine for m in t.messages if m.get("role") == "tool" and "notes.txt" in str(m)
    ]
    assert results, f"{name} did not send the tool's result back\n{report}"
    assert run.returncode == 0, report
    assert "Done." in run.stdout, report
