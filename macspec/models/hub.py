"""Where models live: local folders, package data, or Hugging Face repos in the standard HF cache.

Downloads go into the cache mlx-lm and other tools share. Nothing here prints: download
progress goes to a callback. The HF environment (`HF_HUB_CACHE`, `HF_HOME`, `HF_HUB_OFFLINE`,
`HF_ENDPOINT`) is read on every call, because huggingface_hub reads it once at import time.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import HfApi, constants, hf_hub_download, snapshot_download
from huggingface_hub.errors import (
    GatedRepoError,
    HfHubHTTPError,
    HFValidationError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
)
from huggingface_hub.utils import filter_repo_objects, validate_repo_id
from tqdm.std import tqdm as std_tqdm

from macspec.errors import MacspecError

ALLOW_PATTERNS = [
    "*.json",
    "model*.safetensors",
    "*.py",
    "tokenizer.model",
    "*.tiktoken",
    "tiktoken.model",
    "*.txt",
    "*.jsonl",
    "*.jinja",
]
"""The files a model needs, as mlx-lm's own downloader fetches them."""
PACKAGE_PREFIX = "package:"
PACKAGE_ROOT = Path(__file__).resolve().parent.parent
"""The installed macspec package: `package:` names are folders inside it."""


class NotDownloadedError(MacspecError):
    """A repo id that is not (completely) in the local Hugging Face cache."""


def hf_cache_dir() -> Path:
    """The Hugging Face hub cache: `HF_HUB_CACHE`, else `HF_HOME/hub`, else the library default."""
    for variable in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(variable):
            return Path(os.path.expandvars(os.environ[variable])).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.path.expandvars(os.environ["HF_HOME"])).expanduser() / "hub"
    return Path(constants.HF_HUB_CACHE)


def is_offline() -> bool:
    """True when `HF_HUB_OFFLINE` (or `TRANSFORMERS_OFFLINE`) is set now, or was at import."""
    for variable in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(variable, "").strip().upper() in {"1", "ON", "YES", "TRUE"}:
            return True
    return constants.HF_HUB_OFFLINE


def _endpoint() -> str | None:
    return os.environ.get("HF_ENDPOINT") or None


def is_package_spec(name: str) -> bool:
    """True for `package:demo/target`-style names of models shipped inside macspec."""
    return name.startswith(PACKAGE_PREFIX)


def is_repo_id(name: str) -> bool:
    """True when `name` is a valid `org/name` Hugging Face id, not a local path or package spec."""
    if name.count("/") != 1 or name.startswith((".", "/", "~")) or is_package_spec(name):
        return False
    try:
        validate_repo_id(name)  # what the hub client would refuse later, with a traceback
    except HFValidationError:
        return False
    return True


def display_name(name: str | None) -> str | None:
    """A model's name as output shows it: a shipped model without the internal `package:`
    prefix (`demo/target`), any other name as given."""
    return name.removeprefix(PACKAGE_PREFIX) if name is not None else None


def package_path(name: str) -> Path:
    """The folder inside the installed macspec package that a `package:` name points to."""
    return PACKAGE_ROOT / name.removeprefix(PACKAGE_PREFIX)


def repo_cache_folder(repo: str) -> Path:
    """The `models--org--name` folder of a repo in the HF cache (it may not exist)."""
    return hf_cache_dir() / ("models--" + repo.replace("/", "--"))


def is_complete(path: Path) -> bool:
    """A model folder with its config and every weight file its index names (or one shard)."""
    if not (path / "config.json").is_file():
        return False
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
        except (OSError, ValueError, KeyError, AttributeError):
            return False
        return all((path / shard).is_file() for shard in shards)
    return any(p.is_file() for p in path.glob("model*.safetensors"))


def cached_model_path(repo: str) -> Path | None:
    """The complete local snapshot of `repo`, or None; never touches the network."""
    try:
        path = Path(
            snapshot_download(
                repo, local_files_only=True, cache_dir=hf_cache_dir(), allow_patterns=ALLOW_PATTERNS
            )
        )
    except LocalEntryNotFoundError:  # includes an incomplete (interrupted) snapshot
        return None
    return path if is_complete(path) else None


def find_local(name: str) -> Path | None:
    """Like `local_model_path`, but None instead of an error when the model is not here."""
    try:
        return local_model_path(name)
    except MacspecError:
        return None


def gguf_model_path(path: Path) -> Path:
    """The model folder derived from a GGUF file (made on first use, cached by the file's
    hash; the weights stay in the file): one place for every name that is a GGUF file."""
    from macspec.models.gguf.folder import gguf_folder

    return gguf_folder(path)


def local_model_path(name: str) -> Path:
    """Resolve a model folder, a GGUF file, a `package:` name, a store name (Ollama's, LM
    Studio's) or a repo id already in the local HF cache; anything else is one line.

    Never touches the network: running a model must work offline once it is pulled.
    """
    from macspec.models import stores  # the stores' modules are small, but not needed at import

    if is_package_spec(name):
        path = package_path(name)
        if not (path / "config.json").is_file():
            raise MacspecError(f"{name}: not installed with this macspec ({path} has no model)")
        return path
    if not name.strip():
        raise MacspecError(f"an empty model name; give {stores.FORMS}")
    found = stores.find(name)  # a store name: its GGUF file or MLX folder, read as any path
    path = found.path if found is not None else Path(name).expanduser()
    # A .gguf name (even a missing one: the GGUF reader says what is wrong), or any file with
    # GGUF's magic (an Ollama blob has no suffix).
    if path.suffix.lower() == ".gguf" or (path.is_file() and stores.is_gguf(path)):
        return gguf_model_path(path)
    if path.exists():
        if not (path / "config.json").is_file():
            what = "a file that is not GGUF" if path.is_file() else "a folder with no config.json"
            raise MacspecError(f"{name}: not a model ({what}); give {stores.FORMS}")
        return path
    if not is_repo_id(name):
        if name.startswith((".", "/", "~")) or name.count("/") > 1:
            raise MacspecError(f"{name}: no such model folder or file")
        raise stores.not_a_model(name)
    cached = cached_model_path(name)
    if cached is None:
        raise NotDownloadedError(f"{name} is not downloaded; run: macspec pull {name}")
    return cached


def size_on_disk(path: Path) -> int:
    """Bytes used by the files under `path`, following the cache's symlinks to blobs, once each."""
    seen: set[Path] = set()
    total = 0
    for file in path.rglob("*"):
        real = file.resolve()
        if real in seen or not real.is_file():
            continue
        seen.add(real)
        total += real.stat().st_size
    return total


def nearest_existing(path: Path) -> Path:
    """`path` resolved, or its nearest parent that exists."""
    probe = path.resolve()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return probe


def free_disk_bytes(path: Path) -> int:
    """Free bytes on the disk holding `path` (or its nearest existing parent)."""
    return shutil.disk_usage(nearest_existing(path)).free


@dataclass(frozen=True)
class DownloadPlan:
    """What pulling one repo will fetch, as the hub reports it."""

    repo: str
    """The repo id."""
    download_bytes: int
    """Bytes still to fetch (files not yet in the cache)."""
    files: int
    """Number of files still to fetch."""


def _hub_error(repo: str, exc: BaseException) -> MacspecError:
    """One line for a failure to reach or use the hub while pulling `repo`."""
    cause = exc
    if isinstance(cause, GatedRepoError):
        return MacspecError(f"{repo} is gated: accept its terms on huggingface.co and log in")
    if isinstance(cause, RepositoryNotFoundError):
        return MacspecError(f"{repo}: no such model on the Hugging Face hub (or it is private)")
    if isinstance(cause, HfHubHTTPError) and cause.response is not None:
        return MacspecError(
            f"cannot download {repo}: the hub answered HTTP {cause.response.status_code}"
        )
    detail = str(cause).splitlines()[0] if str(cause) else type(cause).__name__
    return MacspecError(f"cannot reach the Hugging Face hub to download {repo} ({detail})")


def _require_online(repo: str) -> None:
    if is_offline():
        raise MacspecError(
            f"{repo} is not downloaded and HF_HUB_OFFLINE is set; unset it to download"
        )


def plan_download(repo: str) -> DownloadPlan:
    """Ask the hub which of `repo`'s model files are not in the cache yet, and their sizes.

    Network, but writes nothing: a refused pull leaves the cache as it was.
    """
    _require_online(repo)
    try:
        info = HfApi(endpoint=_endpoint()).model_info(repo, files_metadata=True)
    except Exception as exc:  # noqa: BLE001  (every hub failure becomes one line)
        raise _hub_error(repo, exc) from None
    sizes = {s.rfilename: s.size or 0 for s in info.siblings or []}
    snapshot = repo_cache_folder(repo) / "snapshots" / str(info.sha)
    todo = [
        name
        for name in filter_repo_objects(list(sizes), allow_patterns=ALLOW_PATTERNS)
        if not (snapshot / name).is_file()
    ]
    return DownloadPlan(repo, sum(sizes[name] for name in todo), len(todo))


def check_disk_space(needed_bytes: int, what: str) -> None:
    """Refuse (one line) when the HF cache's disk has less than `needed_bytes` free."""
    free = free_disk_bytes(hf_cache_dir())
    if needed_bytes > free:
        raise MacspecError(
            f"not enough disk space for {what}: needs {needed_bytes / 1e9:.1f} GB, "
            f"{free / 1e9:.1f} GB free in {hf_cache_dir()}"
        )


@dataclass(frozen=True)
class DownloadProgress:
    """One progress report while a repo downloads."""

    repo: str
    """The repo being downloaded."""
    done_bytes: int
    """Bytes written so far (including bytes resumed from an interrupted download)."""
    total_bytes: int | None
    """Bytes expected in all; None until the hub has said."""


ProgressCallback = Callable[[DownloadProgress], None]


def _progress_class(repo: str, callback: ProgressCallback) -> type[std_tqdm]:
    """A silent tqdm class for `snapshot_download` that forwards the byte count to `callback`."""

    class _Sink:
        def write(self, _text: str) -> None: ...
        def flush(self) -> None: ...

    lock = threading.Lock()

    class _ReportingTqdm(std_tqdm):
        def __init__(self, *args, **kwargs):
            kwargs.update(file=_Sink(), disable=False)
            kwargs.pop("name", None)
            self._is_bytes = str(kwargs.get("desc", "")).startswith("Reconstruct")
            super().__init__(*args, **kwargs)

        def update(self, n=1):
            result = super().update(n)
            self._report()
            return result

        def refresh(self, *args, **kwargs):
            result = super().refresh(*args, **kwargs)
            self._report()
            return result

        def _report(self) -> None:
            if getattr(self, "_is_bytes", False):
                with lock:
                    callback(DownloadProgress(repo, int(self.n), int(self.total or 0) or None))

    return _ReportingTqdm


def download(repo: str, on_progress: ProgressCallback | None = None) -> Path:
    """Fetch `repo`'s model files into the HF cache; an interrupted download resumes.

    A repo already complete in the cache returns at once, with no network work.
    """
    cached = cached_model_path(repo)
    if cached is not None:
        return cached
    _require_online(repo)
    tqdm_class = _progress_class(repo, on_progress) if on_progress else None
    try:
        path = Path(
            snapshot_download(
                repo,
                cache_dir=hf_cache_dir(),
                allow_patterns=ALLOW_PATTERNS,
                endpoint=_endpoint(),
                tqdm_class=tqdm_class,
            )
        )
    except Exception as exc:  # noqa: BLE001  (every hub failure becomes one line)
        raise _hub_error(repo, exc) from None
    if not is_complete(path):
        raise MacspecError(
            f"{repo}: downloaded, but it has no config.json or weights; is it an mlx-lm model?"
        )
    return path


def cached_config(repo: str) -> dict | None:
    """`config.json` of a repo if the cache has it (even mid-download), else None; offline."""
    folder = repo_cache_folder(repo)
    try:
        commit = (folder / "refs" / "main").read_text().strip()
        return json.loads((folder / "snapshots" / commit / "config.json").read_text())
    except (OSError, ValueError):
        return None


def download_config(repo: str) -> dict | None:
    """`config.json` (small) from the cache or else the hub, so memory can be estimated before
    the weights come; None when it cannot be had (best effort, never an error)."""
    cached = cached_config(repo)
    if cached is not None or is_offline():
        return cached
    try:
        path = hf_hub_download(repo, "config.json", cache_dir=hf_cache_dir(), endpoint=_endpoint())
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except Exception:  # noqa: BLE001  (only a warning depends on it)
        return None


def remove_repo(repo: str) -> int:
    """Delete a repo's whole folder from the HF cache (blobs, snapshots, partial downloads).

    Returns the bytes freed; 0 when nothing was there.
    """
    folder = repo_cache_folder(repo)
    if not folder.is_dir():
        return 0
    freed = size_on_disk(folder)
    shutil.rmtree(folder)
    return freed
