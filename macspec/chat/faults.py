"""What goes wrong with the chat database, said in words the user can act on.

SQLite reports a locked database, a read-only file, a full disk and a damaged page as
`sqlite3.Error`s; the store turns each into a `StorageError` (a one-line MacspecError naming
the file and the problem), so the CLI prints one line and the chat can say what was not saved.
"""

from __future__ import annotations

import shlex
import sqlite3
import tempfile
from pathlib import Path

from macspec.errors import MacspecError
from macspec.models.home import check_home_is_a_folder


class StorageError(MacspecError):
    """The chat database could not be read or written; the message names the file and why."""

    def __init__(self, path: Path, problem: str, read_only: bool = False):
        super().__init__(f"{path}: {problem}")
        self.path, self.problem = path, problem
        self.read_only = read_only
        """SQLite refused to write a file it opened read-only."""


def move_aside(path: Path) -> str:
    """The shell command that moves a damaged file aside, quoted for pasting (the macOS home,
    ~/Library/Application Support, has a space)."""
    return f"mv {shlex.quote(str(path))} {shlex.quote(str(path) + '.damaged')}"


class DamagedDatabase(StorageError):
    """The database file is damaged (or its tables are not what this macspec wrote)."""

    def __init__(self, path: Path, detail: str):
        super().__init__(
            path,
            f"the chat database is damaged ({detail}); `macspec history --export FILE` saves "
            f"what can still be read, then move it aside ({move_aside(path)}) and "
            "macspec starts a new one",
        )


class NewerSchema(MacspecError):
    """The database was written by a newer macspec: refused, and nothing is written to it."""


def _code(exc: sqlite3.Error) -> str:
    """SQLite's error name ('SQLITE_FULL'), or '' before Python 3.11."""
    return getattr(exc, "sqlite_errorname", "") or ""


def is_damage(exc: sqlite3.Error) -> bool:
    """A damaged file, as opposed to one that is locked, read-only or on a full disk."""
    code, text = _code(exc), str(exc)
    return (
        code.startswith("SQLITE_CORRUPT")
        or code == "SQLITE_NOTADB"
        or "malformed" in text
        or "not a database" in text
    )


def folder_problem(folder: Path) -> str | None:
    """Why a file cannot be created in `folder` ('Read-only file system', ...), or None.

    Tried, not guessed from permission bits: root, read-only mounts and immutable files all
    answer the same way then.
    """
    try:
        with tempfile.TemporaryFile(dir=folder):
            return None
    except OSError as exc:
        return exc.strerror or str(exc)


def describe(exc: sqlite3.Error | OSError, path: Path, busy_timeout_s: float) -> StorageError:
    """A StorageError that says, in words, why an operation on the database at `path` failed."""
    if isinstance(exc, OSError):
        return StorageError(path, exc.strerror or str(exc))
    code, text = _code(exc), str(exc)
    if is_damage(exc):
        return DamagedDatabase(path, text)
    if code.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or "locked" in text:
        return StorageError(
            path,
            f"the chat database is locked by another process (still busy after "
            f"{busy_timeout_s:g} s)",
        )
    if code == "SQLITE_FULL" or "disk is full" in text:
        return StorageError(path, "the disk is full")
    if code.startswith("SQLITE_READONLY") or "readonly" in text:
        why = folder_problem(path.parent) if code == "SQLITE_READONLY_DIRECTORY" else None
        if why is not None:
            problem = f"its folder {path.parent} is not writable ({why})"
            return StorageError(path, problem, read_only=True)
        return StorageError(path, "the chat database is read-only", read_only=True)
    if code.startswith("SQLITE_CANTOPEN") or "unable to open" in text:
        why = folder_problem(path.parent)
        if why is not None:
            return StorageError(path, f"cannot open the chat database: {path.parent}: {why}")
        return StorageError(path, "cannot open the chat database")
    if code.startswith("SQLITE_IOERR") or "disk I/O error" in text:
        return StorageError(path, f"a disk I/O error ({text})")
    return StorageError(path, f"the chat database failed: {text}")


def prepare_home(database: Path) -> None:
    """Create the folder the database lives in; a file in its way, a parent that cannot be
    written or a read-only home is one line naming the path and the problem."""
    home = database.parent
    check_home_is_a_folder(home)
    try:
        home.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise MacspecError(
            f"{home}: cannot create the macspec home ({exc.strerror or exc}); set MACSPEC_HOME "
            "to a folder you can write"
        ) from None
    if not database.exists() and (why := folder_problem(home)) is not None:
        raise MacspecError(
            f"{home}: cannot create {database.name} in the macspec home ({why}); make it "
            "writable, or set MACSPEC_HOME to another folder"
        )
