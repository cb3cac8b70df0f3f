"""Capture what Claude Code, Codex CLI and opencode send: writes tests/fixtures/agents/*.json.

Dev-only. Needs the CLIs from npm, e.g.

    npm install --prefix /tmp/agents @anthropic-ai/claude-code@2.1.332 @openai/codex@0.171.0 \\
        opencode-ai@1.18.33
    python scripts/capture/capture_agents.py --bin /tmp/agents/node_modules/.bin

Each CLI runs once, non-interactively, in a fresh temporary HOME, against the recording server
of scripts/capture/record_agent_requests.py, which answers its first request with one tool call (the
call the tool fixture model makes, tests/toolkit.py AGENT_CALLS) and the next with "ok". Saved per
agent: `NAME.json` (the first request that offers tools) and `NAME_followup.json` (the request
that carries the tool's result back); opencode's title request (no tools) as
`opencode_title.json`. Each file holds method, path, query, headers and body, with session,
device and installation ids replaced by zeros.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[2]))

from record_agent_requests import Recorder  # noqa: E402

from tests.toolkit import AGENT_CALLS  # noqa: E402

MODEL = "macspec-test"
ROOT = Path("/tmp/macspec-agents")  # fixed paths, so the captures do not change run to run
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
HEX64 = re.compile(r"\b[0-9a-f]{64}\b")
OPENCODE_SESSION = re.compile(r"ses_[0-9A-Za-z]{26}")
DROPPED_HEADERS = {"host", "content-length", "connection", "accept-encoding"}


def sanitize(entry: dict) -> dict:
    text = json.dumps(entry)
    text = UUID.sub("00000000-0000-0000-0000-000000000000", text)
    text = HEX64.sub("0" * 64, text)
    text = OPENCODE_SESSION.sub("ses_" + "0" * 26, text)
    clean = json.loads(text)
    clean["headers"] = {
        k: v for k, v in clean["headers"].items() if k.lower() not in DROPPED_HEADERS
    }
    clean.pop("time", None)
    return clean


def commands(bin_dir: Path, home: Path, url: str) -> dict[str, tuple[list[str], dict]]:
    """Each CLI's command line and environment: only env vars and config files in `home`."""
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True)
    (codex_home / "config.toml").write_text(
        f'model = "{MODEL}"\nmodel_provider = "macspec"\n\n'
        f'[model_providers.macspec]\nname = "macspec"\nbase_url = "{url}/v1"\n'
        'wire_api = "responses"\n'
    )
    opencode_dir = home / ".config" / "opencode"
    opencode_dir.mkdir(parents=True)
    provider = {
        "npm": "@ai-sdk/openai-compatible",
        "name": "macspec",
        "options": {"baseURL": f"{url}/v1", "apiKey": "x"},
        "models": {MODEL: {"name": MODEL}},
    }
    opencode_config = {"provider": {"macspec": provider}, "model": f"macspec/{MODEL}"}
    (opencode_dir / "opencode.json").write_text(json.dumps(opencode_config, indent=1))
    base = {"PATH": os.environ["PATH"], "HOME": str(home), "LANG": "C.UTF-8"}
    prompt = "List the files in this folder."
    return {
        "claude_code": (
            [str(bin_dir / "claude"), "-p", prompt, "--output-format", "stream-json", "--verbose"],
            base | {"ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": "x", "ANTHROPIC_MODEL": MODEL},
        ),
        "codex": (
            [str(bin_dir / "codex"), "exec", "--skip-git-repo-check", prompt],
            base | {"CODEX_HOME": str(codex_home)},
        ),
        "opencode": ([str(bin_dir / "opencode"), "run", prompt], base),
    }


def capture(name: str, bin_dir: Path, out: Path) -> None:
    log = ROOT / f"{name}.jsonl"
    log.unlink(missing_ok=True)
    tool, args = AGENT_CALLS[name]
    handler = type("Handler", (Recorder,), {"log_path": log, "call": (tool, args)})
    handler.models = set()
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    home, work = ROOT / "home", ROOT / "work"
    shutil.rmtree(home, ignore_errors=True)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    (work / "notes.txt").write_text("hello\n")
    argv, env = commands(bin_dir, home, url)[name]
    run = subprocess.run(
        argv, cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    server.shutdown()
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    posts = [e for e in entries if e["method"] == "POST"]
    first = next(e for e in posts if e["body"].get("tools"))
    followup = posts[posts.index(first) + 1]
    print(f"{name}: exit {run.returncode}, {len(entries)} requests:")
    for e in entries:
        print(f"  {e['method']} {e['path']} tools={len((e['body'] or {}).get('tools') or [])}")
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(sanitize(first), indent=1) + "\n")
    (out / f"{name}_followup.json").write_text(json.dumps(sanitize(followup), indent=1) + "\n")
    if name == "opencode":
        title = next(e for e in posts if not e["body"].get("tools"))
        (out / "opencode_title.json").write_text(json.dumps(sanitize(title), indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bin", type=Path, required=True, help="folder holding the three CLIs")
    parser.add_argument(
        "--out", type=Path, default=Path("tests/fixtures/agents"), help="where to write"
    )
    parser.add_argument("--only", choices=["claude_code", "codex", "opencode"], help="one agent")
    args = parser.parse_args()
    ROOT.mkdir(exist_ok=True)
    tempfile.tempdir = str(ROOT)
    for name in [args.only] if args.only else ["claude_code", "codex", "opencode"]:
        capture(name, args.bin, args.out)


if __name__ == "__main__":
    main()
