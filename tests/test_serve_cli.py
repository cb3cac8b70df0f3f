"""`macspec serve` as a user runs it: flags, the context from config.json, the host rule, and a
SIGTERM that lets the answer in flight finish before the process exits."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import httpx
import openai
import pytest
from servekit import save_pair

from macspec.cli import main


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    target, draft = save_pair(tmp_path_factory.mktemp("servecli"))
    config = json.loads((target / "config.json").read_text())
    config["max_position_embeddings"] = 300  # the context the server enforces (413)
    (target / "config.json").write_text(json.dumps(config))
    return target, draft


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.5", "myhost.example"])
def test_a_public_host_needs_a_key_or_insecure(host, capsys):
    assert main(["serve", "--host", host, "--model", "/nowhere"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--api-key" in err and "--insecure" in err


def test_bad_flags_are_one_line_errors(capsys, folders):
    assert main(["serve", "--model", str(folders[0]), "--port", "70000"]) == 2
    assert "--port" in capsys.readouterr().err
    assert main(["serve", "--model", str(folders[0]), "--draft", "nope"]) == 2
    assert main(["serve", "--model", str(folders[0]), "--context-length", "1"]) == 2
    assert "--context-length must be >= 2" in capsys.readouterr().err


def test_the_context_length_can_be_set(folders, tmp_path):
    """The target's config says 300 positions; --context-length 60 makes a 100-token prompt
    too long, and one past the model's window is said in a warning."""
    process, url, log = start(folders, tmp_path, "--context-length", "60")
    try:
        api = openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=60)
        ask = dict(model=str(folders[0]), messages=[{"role": "user", "content": "x" * 100}])
        with pytest.raises(openai.APIStatusError) as too_long:
            api.chat.completions.create(**ask)
        assert too_long.value.status_code == 413 and "60" in too_long.value.message
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(30)
    process, url, log = start(folders, tmp_path, "--context-length", "4096")
    process.send_signal(signal.SIGTERM)
    process.wait(30)
    assert "--context-length 4096 is beyond the model's 300 positions" in log.read_text()


def start(folders, tmp_path, *flags: str):
    target, draft = folders
    log = tmp_path / "serve.log"
    command = [sys.executable, "-m", "macspec", "serve", "--model", str(target)]
    command += ["--draft-model", str(draft), "--port", "0", *flags]
    env = {**os.environ, "MACSPEC_HOME": str(tmp_path / "home")}
    process = subprocess.Popen(command, stderr=log.open("w"), stdout=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        found = re.search(r"at (http://\S+/v1);", log.read_text())
        if found:
            return process, found.group(1), log
        if process.poll() is not None:
            break
        time.sleep(0.1)
    process.kill()
    raise AssertionError(f"the server did not start:\n{log.read_text()}")


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "ctrl-c"])
def test_serve_end_to_end_and_a_stop_drains(folders, tmp_path, stop):
    process, url, log = start(folders, tmp_path, "--api-key", "k3y", "--max-queue", "2", "-k", "2")
    try:
        api = openai.OpenAI(base_url=url, api_key="k3y", max_retries=0, timeout=60)
        assert [m.id for m in api.models.list()] == [str(folders[0])]
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=url, api_key="bad", max_retries=0).models.list()
        # The context comes from the target's config.json: 300 tokens.
        with pytest.raises(openai.APIStatusError) as too_long:
            api.chat.completions.create(
                model=str(folders[0]), messages=[{"role": "user", "content": "x" * 400}]
            )
        assert too_long.value.status_code == 413

        ask = dict(
            model=str(folders[0]),
            messages=[{"role": "user", "content": "prompt number 0"}],
            max_tokens=120,
        )
        # Once first: MLX's CPU backend compiles kernels with system(), which ignores SIGINT
        # while the compiler runs (Linux only); a Ctrl-C then would be lost, not mishandled.
        api.chat.completions.create(**ask)
        stream = api.chat.completions.create(**ask, stream=True)
        chunks = [next(stream), next(stream)]  # the role, then the first token
        process.send_signal(stop)  # mid-answer: the answer still finishes
        chunks += list(stream)
        assert chunks[-1].choices[0].finish_reason == "length"
        assert chunks[-1].model_extra["macspec"]["k"] == 2
        assert process.wait(30) == 0, log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
    text = log.read_text()
    assert "server stopped" in text and "Traceback" not in text
    assert "stopping: finishing 1 answer in flight" in text
    assert re.search(r"POST /v1/chat/completions 200 · \d+ prompt .* 120 tokens", text)
    assert "POST /v1/chat/completions 413" in text
    with pytest.raises(httpx.ConnectError):
        httpx.get(url.removesuffix("/v1") + "/health", timeout=2)


@pytest.mark.parametrize("batch", ["8", "1"])
def test_a_second_ctrl_c_cuts_the_answers_short_and_exits_cleanly(folders, tmp_path, batch):
    """Mid-answer, with a second request waiting its turn where requests go one at a time: the
    answer ends cut short, the waiting one gets a 503, and the server exits cleanly."""
    import threading

    process, url, log = start(folders, tmp_path, "-k", "2", "--max-batch", batch)
    waited: list = []
    try:
        api = openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=60)
        ask = dict(
            model=str(folders[0]),
            messages=[{"role": "user", "content": "prompt number 0"}],
            max_tokens=280,
        )
        api.chat.completions.create(**{**ask, "max_tokens": 2})  # kernels compiled (see above)
        stream = api.chat.completions.create(**ask, stream=True)
        chunks = [next(stream), next(stream)]

        def wait_in_line() -> None:
            try:
                waited.append(api.chat.completions.create(**ask))
            except openai.APIStatusError as exc:
                waited.append(exc.status_code)

        second = threading.Thread(target=wait_in_line)
        second.start()
        time.sleep(0.3)  # queued (one at a time) or batched in
        process.send_signal(signal.SIGINT)
        time.sleep(0.05)
        process.send_signal(signal.SIGINT)
        chunks += list(stream)  # ends, cut short, without an error
        assert chunks[-1].choices[0].finish_reason is not None
        assert len(chunks) < 200
        second.join(30)
        if batch == "1":
            # It never started ("the server is shutting down"); on a loaded machine the first
            # Ctrl-C's drain may have let it start before the second: then it is cut short and
            # says so ('cancelled', never a whole answer's 'stop').
            assert waited == [503] or waited[0].choices[0].finish_reason == "cancelled", waited
        else:
            assert waited and not isinstance(waited[0], int)  # batched in, then cut short
        assert process.wait(30) == 0, log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
    text = log.read_text()
    assert "stopping now: cutting short the answers in flight" in text
    assert "server stopped" in text and "Traceback" not in text and "terminate" not in text


def test_a_taken_port_is_said_before_the_model_loads(folders, capsys, monkeypatch):
    import socket

    loads = []
    monkeypatch.setattr("macspec.models.pairs.open_pair", lambda *a, **k: loads.append(1))
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    try:
        port = str(taken.getsockname()[1])
        assert main(["serve", "--model", str(folders[0]), "--port", port]) == 2
    finally:
        taken.close()
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port}" in err and "loading" not in err
    assert loads == []  # refused before any weight was read


def test_max_batch_is_checked(folders, capsys):
    assert main(["serve", "--model", str(folders[0]), "--max-batch", "0"]) == 2
    assert "--max-batch" in capsys.readouterr().err
