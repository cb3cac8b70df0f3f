"""The disk tier: block files under one folder, a subfolder per model, bounded in size.

    prompt-cache/                    ($MACSPEC_HOME/prompt-cache, or --disk-cache-dir)
      <model fingerprint[:16]>/
        model.json                   which model this is (name, folder, fingerprint)
        <key[:2]>/<key>.<kind>.safetensors

A file's modification time is its last use: set when written and whenever a request reads or
reuses it, a block deeper in its chain a little older than its parent, so eviction (least
recently used first) cuts chains from their ends, never their shared beginnings; recurrent
states between checkpoints (`state-thin`) go first while they fill more than their share of
the bound (`settings.THIN_SHARE`), so older prompts thin out to their checkpoints. Several
processes share the folder with no lock: files are written once, renamed into place whole,
and a file deleted under a reader is simply missing for it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx

from macspec.models.home import check_folder_path
from macspec.models.hub import display_name
from macspec.prefix import blockfile
from macspec.prefix.blockfile import TEMP_MARK, Damaged
from macspec.prefix.settings import THIN_SHARE

log = logging.getLogger("macspec.prefix")

MODEL_FILE = "model.json"
SUFFIX = ".safetensors"
STALE_TEMP_S = 3600.0
"""A temporary file older than this was left by a killed writer: it is deleted."""
READERS = 4
"""Block files read and checked at once when a prefix is restored."""
DEPTH_NS = 1000
"""Each block of a chain is this much older than its parent (in its last-use time)."""
THIN = ".state-thin" + SUFFIX
"""How a recurrent state between checkpoints ends its name (evicted first)."""


@dataclass
class ModelUsage:
    """What one model's folder holds (for `macspec cache`)."""

    folder: Path
    name: str
    """The model as it was named when its first block was written."""
    bytes: int = 0
    files: dict[str, int] | None = None
    """Files by kind: rows, state, hidden-*."""
    last_used: float = 0.0


class DiskStore:
    """Block files under `root`, at most `max_bytes` in all (checked after writes)."""

    def __init__(self, root: Path, max_bytes: int, thin_share: float = THIN_SHARE):
        self.root = Path(root)
        check_folder_path(
            self.root, "the prompt cache folder", "give --disk-cache-dir another folder"
        )
        self.max_bytes = max_bytes
        self.thin_share = thin_share
        """Thin states are evicted first while over the bound and above this share of it."""

    # -- names ---------------------------------------------------------------------------------
    def model_folder(self, fingerprint: str) -> Path:
        return self.root / fingerprint[:16]

    def path(self, fingerprint: str, key: str, kind: str) -> Path:
        return self.model_folder(fingerprint) / key[:2] / f"{key}.{kind}{SUFFIX}"

    def register(self, fingerprint: str, description: dict) -> None:
        """Write the model's folder and its model.json (once; several processes may race)."""
        folder = self.model_folder(fingerprint)
        target = folder / MODEL_FILE
        if target.is_file():
            return
        folder.mkdir(parents=True, exist_ok=True)
        temp = folder / f"{MODEL_FILE}{TEMP_MARK}{os.getpid()}"
        temp.write_text(json.dumps({**description, "fingerprint": fingerprint}, indent=2))
        os.replace(temp, target)

    # -- blocks --------------------------------------------------------------------------------
    def load(self, path: Path, key: str, kind: str) -> dict[str, mx.array] | None:
        """A block's arrays, checked; None when it is missing, or damaged (then deleted, with
        one log line: it is never used)."""
        return self.load_many([(path, key, kind)])[0]

    def load_many(self, wanted: list[tuple[Path, str, str]]) -> list[dict[str, mx.array] | None]:
        """`load` for several blocks: read and checked on threads, arrays made on this one."""
        with ThreadPoolExecutor(max_workers=READERS) as pool:
            checked = list(pool.map(lambda w: self._check(*w), wanted))
        return [c.arrays() if c is not None else None for c in checked]

    @staticmethod
    def _check(path: Path, key: str, kind: str) -> blockfile.Checked | None:
        try:
            return blockfile.check(path, key, kind)
        except FileNotFoundError:
            return None
        except (Damaged, OSError, KeyError, ValueError, TypeError) as exc:
            log.warning("prompt cache: dropped %s: %s", path, exc)
            path.unlink(missing_ok=True)
            return None

    def save(self, path: Path, arrays: dict[str, mx.array], meta: dict, depth: int) -> int:
        """Write a block unless it is there already; the bytes written (0 if it was)."""
        if path.is_file():
            self.touch(path, depth)
            return 0
        path.parent.mkdir(parents=True, exist_ok=True)
        written = blockfile.write(path, arrays, meta)
        self.touch(path, depth)
        return written

    @staticmethod
    def touch(path: Path, depth: int, now_ns: int | None = None) -> None:
        """Mark a block used now (deeper blocks of a chain a little older)."""
        stamp = (now_ns if now_ns is not None else time.time_ns()) - depth * DEPTH_NS
        try:
            os.utime(path, ns=(stamp, stamp))
        except OSError:  # evicted meanwhile by another process
            pass

    # -- size ----------------------------------------------------------------------------------
    def _files(self) -> list[tuple[int, int, Path]]:
        """(last use in ns, size, path) of every block file; stale temporary files deleted."""
        found = []
        now = time.time()
        for folder in _subfolders(self.root):
            for sub in _subfolders(folder):
                for entry in _entries(sub):
                    try:
                        info = entry.stat()
                    except OSError:
                        continue
                    if TEMP_MARK in entry.name:
                        if now - info.st_mtime > STALE_TEMP_S:
                            Path(entry.path).unlink(missing_ok=True)
                            continue
                    found.append((info.st_mtime_ns, info.st_size, Path(entry.path)))
        return found

    def total_bytes(self) -> int:
        return sum(size for _, size, _ in self._files())

    def evict(self) -> int:
        """Delete files until the folder fits `max_bytes`: thin states first (oldest first)
        while they fill more than `thin_share` of it, then the least recently used of all;
        returns the bytes freed."""
        files = [f for f in self._files() if TEMP_MARK not in f[2].name]  # not live writes
        total = sum(size for _, size, _ in files)
        thin = sorted((f for f in files if f[2].name.endswith(THIN)), key=lambda f: f[0])
        thin_bytes = sum(size for _, size, _ in thin)
        gone: set[Path] = set()
        freed = 0
        for _, size, path in thin:
            if total - freed <= self.max_bytes or thin_bytes <= self.thin_share * self.max_bytes:
                break
            path.unlink(missing_ok=True)
            gone.add(path)
            freed += size
            thin_bytes -= size
        for _, size, path in sorted(files, key=lambda f: f[0]):
            if total - freed <= self.max_bytes:
                break
            if path in gone:
                continue
            path.unlink(missing_ok=True)
            freed += size
        return freed

    # -- for `macspec cache` -------------------------------------------------------------------
    def usage(self) -> list[ModelUsage]:
        models = []
        for folder in _subfolders(self.root):
            try:
                described = json.loads((folder / MODEL_FILE).read_text())
            except (OSError, ValueError):
                described = {}
            name = display_name(str(described.get("name") or folder.name))
            usage = ModelUsage(folder, name, files={})
            for sub in _subfolders(folder):
                for entry in _entries(sub):
                    if not entry.name.endswith(SUFFIX):
                        continue
                    try:
                        info = entry.stat()
                    except OSError:
                        continue
                    kind = entry.name[len(entry.name.split(".")[0]) + 1 : -len(SUFFIX)]
                    usage.files[kind] = usage.files.get(kind, 0) + 1
                    usage.bytes += info.st_size
                    usage.last_used = max(usage.last_used, info.st_mtime)
            models.append(usage)
        return sorted(models, key=lambda m: -m.last_used)

    def clear(self, folder: Path | None = None) -> int:
        """Delete one model's folder, or everything; the bytes freed."""
        targets = [folder] if folder is not None else _subfolders(self.root)
        freed = 0
        for target in targets:
            freed += sum(size for _, size, _ in _files_under(target))
            shutil.rmtree(target, ignore_errors=True)
        return freed


def _subfolders(folder: Path) -> list[Path]:
    try:
        return [Path(e.path) for e in os.scandir(folder) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def _entries(folder: Path) -> list[os.DirEntry]:
    try:
        return [e for e in os.scandir(folder) if e.is_file(follow_symlinks=False)]
    except OSError:
        return []


def _files_under(folder: Path) -> list[tuple[int, int, Path]]:
    found = []
    for sub in [folder, *_subfolders(folder)]:
        for entry in _entries(sub):
            try:
                found.append((0, entry.stat().st_size, Path(entry.path)))
            except OSError:
                pass
    return found
