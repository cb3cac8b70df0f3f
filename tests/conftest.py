"""Shared fixtures. Hub/catalog: private HF cache and macspec home, fake models, a fake hub."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import tempfile
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

FAKE_COMMIT = "0123456789abcdef0123456789abcdef01234567"

UNSET_FOR_TESTS = (
    "HF_HUB_OFFLINE",  # pull tests talk to a fake hub on localhost
    "TRANSFORMERS_OFFLINE",
    "HF_ENDPOINT",
    "HF_HOME",
    "HF_HUB_CACHE",
    "HUGGINGFACE_HUB_CACHE",
    "XDG_DATA_HOME",
    "OLLAMA_MODELS",  # Ollama's store: tests build their own under a temp HOME
    "COLUMNS",  # rich tables size themselves by it
    "LINES",
    "NO_COLOR",
    "FORCE_COLOR",
)
"""Environment variables that change what the code under test does: no test sees the user's."""

# huggingface_hub reads some of them once, at import: unset them before anything imports it.
for _variable in UNSET_FOR_TESTS:
    os.environ.pop(_variable, None)


@pytest.fixture(autouse=True)
def isolated_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test runs with its own macspec home, HF cache and temp folder under tmp, and none
    of the user's settings: the suite passes (and touches nothing real) whatever the shell
    sets."""
    for variable in UNSET_FOR_TESTS:
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("MACSPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    # Ollama's and LM Studio's stores are found under HOME: never the user's own.
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    # Temp files (the chat's file of unsaved messages, say) stay in the test's own folder.
    temp = tmp_path / "tmp"
    temp.mkdir(exist_ok=True)
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    try:
        from huggingface_hub import constants
    except ImportError:  # pragma: no cover - it is a dependency
        return
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)


@pytest.fixture
def hf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty HF cache and macspec home under tmp; the hub endpoint is a closed local port."""
    cache = tmp_path / "hf" / "hub"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("MACSPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # refused at once if ever used
    for variable in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HUGGINGFACE_HUB_CACHE"):
        monkeypatch.delenv(variable, raising=False)
    return cache


@pytest.fixture
def disk(tmp_path: Path):
    """A small disk for a chat database that the test fills and frees (see faultkit.Disk)."""
    from faultkit import Disk

    small = Disk(tmp_path / "disk")
    yield small
    small.close()


@pytest.fixture
def network_calls(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Records (and refuses) every attempt to open a network connection."""
    calls: list[object] = []

    def refuse(self, address, *args, **kwargs):
        calls.append(address)
        raise ConnectionRefusedError(f"test: no network ({address})")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    return calls


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory):
    """The tiny byte-level tokenizer of tests/tiny.py (EOS 257), for engine-level tests."""
    import tiny

    folder = tmp_path_factory.mktemp("tok")
    tiny.write_tokenizer(folder)
    return tiny.tokenizer(folder)


@pytest.fixture
def store(tmp_path: Path):
    """A chat store in the test's own folder."""
    from macspec.chat.store import Store

    return Store(tmp_path / "chats.db")


@pytest.fixture
def gguf_as_files(monkeypatch: pytest.MonkeyPatch) -> None:
    """Model names resolve to the GGUF file itself: what loading derives from a file is the GGUF
    loader's business (its own tests), not that of the tests of names and stores."""
    from macspec.models import hub

    monkeypatch.setattr(hub, "gguf_model_path", lambda path: path)


@pytest.fixture(scope="session")
def tiny_model_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny real mlx-lm llama model folder (config.json, model.safetensors, tokenizer)."""
    from tiny import random_model, save_model

    return save_model(random_model(0), tmp_path_factory.mktemp("tiny") / "model")


def put_in_hf_cache(
    cache: Path,
    repo: str,
    source: Path,
    commit: str = FAKE_COMMIT,
    tree: bool = True,
    extra_remote: dict[str, int] | None = None,
) -> Path:
    """Copy a model folder into the real HF cache layout; returns the snapshot folder.

    `models--org--name/{blobs/<sha256>, snapshots/<commit>/<file> -> ../../blobs/.., refs/main}`,
    plus the tree listing huggingface_hub writes (`trees/<commit>.json`) when `tree`, with
    `extra_remote` files (name -> size) that exist on the hub but are not model files.
    """
    repo_dir = cache / ("models--" + repo.replace("/", "--"))
    snapshot = repo_dir / "snapshots" / commit
    listing: dict[str, dict] = {}
    for file in sorted(p for p in source.rglob("*") if p.is_file()):
        data = file.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        blob = repo_dir / "blobs" / digest
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / file.relative_to(source)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
        listing[file.relative_to(source).as_posix()] = {
            "size": len(data),
            "blob_id": hashlib.sha1(data).hexdigest(),
        }
    (repo_dir / "refs").mkdir(parents=True, exist_ok=True)
    (repo_dir / "refs" / "main").write_text(commit)
    if tree:
        for name, size in (extra_remote or {"README.md": 100, ".gitattributes": 50}).items():
            listing[name] = {"size": size, "blob_id": "0" * 40}
        (repo_dir / "trees").mkdir(exist_ok=True)
        (repo_dir / "trees" / f"{commit}.json").write_text(
            json.dumps({"format_version": 1, "files": listing})
        )
    return snapshot


@pytest.fixture
def cached_model(hf_cache: Path, tiny_model_folder: Path) -> Callable[..., Path]:
    """`cached_model("org/name")` puts the tiny model in the test HF cache; returns its snapshot."""

    def put(repo: str, **kwargs) -> Path:
        return put_in_hf_cache(hf_cache, repo, tiny_model_folder, **kwargs)

    return put


class FakeHub:
    """A tiny Hugging Face hub on localhost: repo info, file tree, resolve (with Range), a log."""

    commit = "fedcba9876543210fedcba9876543210fedcba98"

    def __init__(self) -> None:
        self.repos: dict[str, dict[str, bytes]] = {}
        self.log: list[tuple[str, str, str | None]] = []  # (method, path, Range header)
        self.cut_once: set[str] = set()  # file names whose first GET drops after half the body
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.endpoint = f"http://127.0.0.1:{self.server.server_port}"

    def add(self, repo: str, folder: Path, extra: dict[str, bytes] | None = None) -> None:
        """Serve every file of `folder` (plus `extra`, e.g. a README) as `repo`."""
        files = {
            p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*"))
            if p.is_file()
        }
        self.repos[repo] = {**files, **(extra or {"README.md": b"# not a model file\n"})}

    @staticmethod
    def etag(data: bytes) -> str:
        return hashlib.sha1(data).hexdigest()

    def _handler(self):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None: ...

            def _send(
                self,
                status: int,
                body: bytes = b"",
                headers: dict | None = None,
                head: bool = False,
            ) -> None:
                self.send_response(status)
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def _api(self, path: str) -> None:
                parts = path.removeprefix("/api/models/").split("/")
                files = hub.repos.get("/".join(parts[:2]))
                if files is None:
                    return self._send(404, b"{}", {"X-Error-Code": "RepoNotFound"})
                if len(parts) > 2 and parts[2] == "tree":
                    body = [
                        {"type": "file", "path": name, "size": len(data), "oid": hub.etag(data)}
                        for name, data in files.items()
                    ]
                else:
                    body = {
                        "id": "/".join(parts[:2]),
                        "sha": hub.commit,
                        "siblings": [
                            {"rfilename": name, "size": len(data), "blobId": hub.etag(data)}
                            for name, data in files.items()
                        ],
                    }
                self._send(200, json.dumps(body).encode(), {"Content-Type": "application/json"})

            def _resolve(self, path: str, head: bool) -> None:
                org, name, _resolve, _revision, filename = unquote(path).lstrip("/").split("/", 4)
                data = hub.repos.get(f"{org}/{name}", {}).get(filename)
                if data is None:
                    return self._send(404, headers={"X-Error-Code": "EntryNotFound"}, head=head)
                headers = {"X-Repo-Commit": hub.commit, "ETag": f'"{hub.etag(data)}"'}
                start = 0
                if self.headers.get("Range"):
                    start = int(self.headers["Range"].split("=")[1].split("-")[0])
                    headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
                if not head and filename in hub.cut_once:
                    hub.cut_once.discard(filename)
                    self.send_response(200)
                    for key, value in headers.items():
                        self.send_header(key, value)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data[: len(data) // 2])
                    self.close_connection = True
                    return
                self._send(206 if start else 200, data[start:], headers, head)

            def do_HEAD(self) -> None:
                hub.log.append(("HEAD", self.path, self.headers.get("Range")))
                self._resolve(urlparse(self.path).path, head=True)

            def do_GET(self) -> None:
                hub.log.append(("GET", self.path, self.headers.get("Range")))
                path = urlparse(self.path).path
                if path.startswith("/api/models/"):
                    return self._api(path)
                self._resolve(path, head=False)

        return Handler


@pytest.fixture
def fake_hub(hf_cache: Path, monkeypatch: pytest.MonkeyPatch):
    """A FakeHub that HF_ENDPOINT points at (localhost only); stopped after the test."""
    hub = FakeHub()
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    yield hub
    hub.server.shutdown()
    hub.server.server_close()
