"""Storage faults for tests: a lock held by another connection, a read-only file or folder,
a full disk (a tiny tmpfs where the test may mount one, else a failing connection), a
damaged page."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def locked(path: Path) -> Iterator[sqlite3.Connection]:
    """Another connection (another process, as far as SQLite knows) holds the write lock."""
    other = sqlite3.connect(str(path), isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        yield other
    finally:
        other.execute("ROLLBACK")
        other.close()


def _chattr(flag: str, path: Path) -> bool:
    try:
        done = subprocess.run(["chattr", flag, str(path)], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


@contextmanager
def read_only(path: Path) -> Iterator[None]:
    """`path` (a file or a folder) cannot be written, as a user without the rights finds it.

    Permission bits for a normal user; root ignores them, so for root the file is made
    immutable (`chattr +i`), which even root cannot write. Skips where neither works.
    """
    if os.geteuid() != 0:
        mode = path.stat().st_mode
        path.chmod(mode & ~0o222)
        try:
            yield
        finally:
            path.chmod(mode)
        return
    if not _chattr("+i", path):
        pytest.skip("running as root without chattr: cannot make a read-only file")
    try:
        yield
    finally:
        _chattr("-i", path)


class FailingConnection:
    """A sqlite3 connection whose writes fail as on a full disk while `full` is set."""

    WRITES = ("INSERT", "UPDATE", "DELETE", "CREATE", "ALTER")

    def __init__(self, db: sqlite3.Connection):
        self._db, self.full = db, False

    def execute(self, sql: str, *args):
        if self.full and sql.lstrip().upper().startswith(self.WRITES):
            error = sqlite3.OperationalError("database or disk is full")
            error.sqlite_errorname = "SQLITE_FULL"
            raise error
        return self._db.execute(sql, *args)

    def __getattr__(self, name: str):
        return getattr(self._db, name)


class Disk:
    """A small disk for a chat database that the test fills and frees.

    A real tmpfs of `size` where the test may mount one (root on Linux); elsewhere the
    store's connection is wrapped so its writes fail with SQLite's own full-disk error.
    """

    def __init__(self, root: Path, size: str = "1m"):
        self.root, self.mounted, self._stores = root, False, []
        root.mkdir(parents=True, exist_ok=True)
        if sys.platform.startswith("linux") and os.geteuid() == 0:
            done = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(root)],
                capture_output=True,
            )
            self.mounted = done.returncode == 0
        self.filler = root / "filler"

    @property
    def database(self) -> Path:
        return self.root / "chats.db"

    def adopt(self, store) -> None:
        """Let this disk fail the writes of `store` (a Store on `database`)."""
        if not self.mounted:
            store._db = FailingConnection(store._db)
            self._stores.append(store)

    def fill(self) -> None:
        """No more room: writes that need space fail with 'database or disk is full'."""
        if self.mounted:
            fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            try:
                for block in (65536, 512):  # big blocks, then the last crumbs
                    try:
                        while True:
                            os.write(fd, b"\0" * block)
                    except OSError:
                        pass
            finally:
                os.close(fd)
        for store in self._stores:
            store._db.full = True

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)
        for store in self._stores:
            store._db.full = False

    def close(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.root)], capture_output=True)


def damage_page_of(path: Path, marker: bytes) -> int:
    """Break the b-tree page of the database that holds `marker` (its page type byte);
    returns the page number. The store must be closed (its WAL checkpointed) first."""
    data = bytearray(path.read_bytes())
    page_size = int.from_bytes(data[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    at = data.index(marker)
    page = at // page_size
    assert page > 0, "the marker is on the schema page"
    data[page * page_size] = 0x00  # not a b-tree page type: SQLITE_CORRUPT when read
    path.write_bytes(bytes(data))
    return page + 1
