"""`macspec serve` under `mlx.launch -n 2 --backend ring` on localhost: rank 0 serves HTTP, rank 1
runs every generation with it on its half of the target. Answers are the target alone's, a
client that leaves mid-answer leaves both ranks in step, and the server ends cleanly on SIGTERM
or with one line when a rank dies.
"""

from __future__ import annotations

import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from losslesskit import reference
from servekit import save_pair

START_TIMEOUT_S = 180
"""Loading two ranks takes ~20 s on 2 busy cores; a hang fails the test, not CI."""
PROMPTS = [
    [256, 72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100],
    [256, 72, 101, 108, 108, 111, 44, 32, 121, 111, 117],  # shares a prefix with the first
]
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, Path]:
    return save_pair(tmp_path_factory.mktemp("pair"))


class Launched:
    """`mlx.launch -n 2 -- python -m macspec serve …` in the background, and its output."""

    def __init__(self, pair: tuple[Path, Path]):
        launcher = shutil.which("mlx.launch", path=str(Path(sys.executable).parent))
        repo = Path(__file__).resolve().parents[1]
        env = {**os.environ, "PYTHONPATH": str(repo), "MACSPEC_DIST_TIMEOUT": "20"}
        command = [launcher, "-n", "2", "--backend", "ring", "--", sys.executable, "-m"]
        command += ["macspec", "serve", "--model", str(pair[0]), "--draft-model", str(pair[1]),
                    "-k", "3", "--port", "0"]  # fmt: skip
        self.process = subprocess.Popen(
            command,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        self.url = self.wait_for(r"serving .* at (http://\S+/v1)", START_TIMEOUT_S).group(1)

    def wait_for(self, pattern: str, timeout: float) -> re.Match:
        selector = selectors.DefaultSelector()
        selector.register(self.process.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if selector.select(timeout=1):
                line = self.process.stdout.readline()
                if not line:
                    break
                self.lines.append(line.rstrip("\n"))
                if found := re.search(pattern, line):
                    return found
        raise AssertionError(f"no {pattern!r} in:\n" + "\n".join(self.lines))

    def rest(self, timeout: float) -> tuple[int, list[str]]:
        """Wait for the launcher to end; its exit code and every line it wrote."""
        out, _ = self.process.communicate(timeout=timeout)
        self.lines += out.splitlines()
        return self.process.returncode, self.lines

    def rank_pids(self) -> dict[int, int]:
        """The two ranks' process ids, from their environment (MLX_RANK)."""
        found = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                environ = (entry / "environ").read_bytes().split(b"\0")
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if b"macspec\0serve" in cmdline:
                for item in environ:
                    if item.startswith(b"MLX_RANK="):
                        found[int(item.split(b"=")[1])] = int(entry.name)
        return found

    def kill(self) -> None:
        if self.process.poll() is None:
            for pid in self.rank_pids().values():
                os.kill(pid, signal.SIGKILL)
            self.process.kill()
            self.process.wait(30)


def complete(url: str, prompt: list[int], **more) -> dict:
    body = {"model": "m", "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, **more}
    response = httpx.post(f"{url}/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.fixture(scope="module")
def expected(pair) -> list[str]:
    """The whole target in one process: mlx-lm's greedy answers, as text."""
    from mlx_lm import load

    target, tokenizer = load(str(pair[0]))
    return [tokenizer.decode(reference(target, p, MAX_TOKENS)) for p in PROMPTS]


def test_two_ranks_serve_the_target_alones_answers_and_stop_on_ctrl_c(pair, expected):
    server = Launched(pair)
    try:
        model = httpx.get(f"{server.url}/models", timeout=30).json()["data"][0]["id"]
        first = complete(server.url, PROMPTS[0], model=model)
        assert first["choices"][0]["text"] == expected[0]
        assert first["macspec"]["draft_proposed"] > 0  # it speculated, sharded
        # A client that leaves mid-answer: rank 0 cancels, rank 1 must stop at the same token.
        body = {"model": model, "prompt": PROMPTS[1], "max_tokens": 200, "stream": True}
        with httpx.stream("POST", f"{server.url}/completions", json=body, timeout=60) as r:
            next(r.iter_lines())
        again = complete(server.url, PROMPTS[1], model=model)
        assert again["choices"][0]["text"] == expected[1]
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # on both ranks
        assert complete(server.url, PROMPTS[0], model=model)["choices"][0]["text"] == expected[0]
        # Ctrl-C reaches both ranks: rank 1 waits for rank 0, which drains, tells rank 1, and
        # both end. (Not sent to mlx.launch here: it prints a KeyboardInterrupt traceback of
        # its own on Ctrl-C, from its output relay.)
        for pid in server.rank_pids().values():
            os.kill(pid, signal.SIGINT)
        code, lines = server.rest(timeout=60)
    finally:
        server.kill()
    assert code == 0, "\n".join(lines)
    assert "macspec: server stopped" in lines
    assert not any("Traceback" in line or "error" in line for line in lines), lines


def test_a_lost_rank_stops_the_server_in_one_line(pair):
    """Rank 1 dies. Rank 0 learns it at its next exchange (the next request's announcement,
    or telling rank 1 it stops when mlx.launch stops it first, which it does when a rank fails):
    the server stops, with at most one line saying why, and no traceback. The request that
    found the rank gone gets an error, not a hang."""
    server = Launched(pair)
    try:
        model = httpx.get(f"{server.url}/models", timeout=30).json()["data"][0]["id"]
        complete(server.url, PROMPTS[0], model=model)
        os.kill(server.rank_pids()[1], signal.SIGKILL)
        started = time.monotonic()
        body = {"model": model, "prompt": PROMPTS[1], "max_tokens": MAX_TOKENS}
        try:
            response = httpx.post(f"{server.url}/completions", json=body, timeout=60)
            assert response.status_code >= 500, response.text
        except httpx.TransportError:
            pass  # mlx.launch stopped rank 0 before the request came
        _, lines = server.rest(timeout=60)
        took = time.monotonic() - started
        assert not server.rank_pids(), "a rank is left running"
    finally:
        server.kill()
    # (mlx.launch's own exit code does not say how its ranks ended, and it may drop a line
    # written after it stopped them: the lines it shows are checked.)
    assert took < 45, (took, "\n".join(lines))
    assert not any("Traceback" in line for line in lines), "\n".join(lines)
    errors = [line for line in lines if "error" in line and not line.startswith("[ring]")]
    assert len(errors) <= 1, "\n".join(lines)
    lost = "error: rank 0 lost the other ranks of its group of 2 ([ring] connection to a peer"
    assert all(lost in line for line in errors), errors


def test_an_announcement_carries_the_prompt_and_every_setting():
    """What rank 0 tells the others before a generation: the prompt and the whole config."""
    from macspec.engine.core.config import GenerationConfig
    from macspec.engine.core.sampling import SamplingParams
    from macspec.serve.ranks import decode, encode

    config = GenerationConfig(
        max_tokens=7,
        sampling=SamplingParams(temperature=0.7, top_p=0.9, top_k=5, min_p=0.01),
        stop_strings=("\n\n", "ü€"),
        seed=3,
        context_length=100,
        prefill_step_size=64,
        sampler="coupled",
    )
    prompt = [0, 1, 2**20, 151935]
    values = encode(prompt, config)
    assert all(0 <= v < 2**31 for v in values)  # they travel as int32
    assert decode(values) == (prompt, config)
    assert decode(encode([5], GenerationConfig())) == ([5], GenerationConfig())
