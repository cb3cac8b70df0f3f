"""The user's macspec directory: user config, user catalog; movable with MACSPEC_HOME."""

from __future__ import annotations

import glob
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from macspec.errors import MacspecError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

CONFIG_FILE = "config.toml"
USER_CATALOG_FILE = "models.toml"


def macspec_home() -> Path:
    """The user directory, read from the environment on every call (tests move it).

    `MACSPEC_HOME` wins; else `~/Library/Application Support/macspec` on macOS, else
    `$XDG_DATA_HOME/macspec` or `~/.local/share/macspec`. Never created here: readers
    treat a missing directory as empty.
    """
    override = os.environ.get("MACSPEC_HOME")
    if override:
        return Path(override).expanduser()
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Application Support" / "macspec"
    xdg = os.environ.get("XDG_DATA_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".local" / "share"
    return base / "macspec"


def check_home_is_a_folder(home: Path) -> None:
    """A home that is a file is one line, for commands that only read it too: else they would
    find no database there and report nothing stored."""
    if home.exists() and not home.is_dir():
        raise MacspecError(
            f"{home}: the macspec home is a file, not a folder; move it aside, or set "
            "MACSPEC_HOME to another folder"
        )


def check_folder_path(folder: Path, what: str, fix: str) -> None:
    """One line when a file stands where `folder` (`what`, made on first use) or a folder above
    it must be: the macspec home's own line when that file is the home; else `fix` says what
    to do. Nothing to say while the path is free."""
    for place in (folder, *folder.parents):
        if place.is_dir():
            return
        if place.exists():
            if place == macspec_home():
                check_home_is_a_folder(place)  # raises: the home's own line
            raise MacspecError(f"{place}: {what} is a file, not a folder; move it aside, or {fix}")


def write_folder_whole(folder: Path, fill: Callable[[Path], None], what: str) -> None:
    """A derived model folder written by `fill` in a temporary sibling, then renamed: whole or
    not at all (one another process finished first is kept)."""
    check_folder_path(folder.parent, what, "set MACSPEC_HOME elsewhere")
    folder.parent.mkdir(parents=True, exist_ok=True)
    for left in dead_leftovers(folder.parent, f".{folder.name}.", ""):  # killed mid-fill
        shutil.rmtree(left, ignore_errors=True)
    prefix = f".{folder.name}.{os.getpid()}."
    partial = Path(tempfile.mkdtemp(prefix=prefix, dir=folder.parent))
    try:
        fill(partial)
        os.replace(partial, folder)
    except OSError:
        if not (folder / "config.json").is_file():  # not another process's folder, won the race
            raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def dead_leftovers(parent: Path, prefix: str, suffix: str) -> list[Path]:
    """The temporary files or folders in `parent` named `{prefix}{pid}[.{random}]{suffix}` (the
    writer's pid first) whose writer is gone: killed mid-write, no `finally` removed them."""
    found = []
    for left in parent.glob(f"{glob.escape(prefix)}*{glob.escape(suffix)}"):
        middle = left.name[len(prefix) : len(left.name) - len(suffix)]
        pid, *rest = middle.split(".")
        if pid.isdigit() and len(rest) <= 1 and not process_alive(int(pid)):
            found.append(left)
    return found


def process_alive(pid: int) -> bool:
    """Whether process `pid` still runs: a temporary file of a dead one is never finished."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


def config_path() -> Path:
    """The user config file (`config.toml` in the user directory)."""
    return macspec_home() / CONFIG_FILE


def user_catalog_path() -> Path:
    """The user catalog (`models.toml` in the user directory), merged over the shipped one."""
    return macspec_home() / USER_CATALOG_FILE


def read_toml(path: Path) -> dict[str, Any]:
    """Parse a TOML file; a syntax error or bytes that are not UTF-8 become one line with the
    file and the line."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise MacspecError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise MacspecError(
            f"{path}: not UTF-8 text (byte 0x{data[exc.start]:02x} on line {line}); "
            "TOML files must be UTF-8"
        ) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise MacspecError(f"{path}: invalid TOML: {_toml_error_text(exc)}") from None


def _toml_error_text(exc: Exception) -> str:
    """'line 3, column 8: expected ...' from tomllib's 'Expected ... (at line 3, column 8)'."""
    message = str(exc)
    lineno, colno = getattr(exc, "lineno", None), getattr(exc, "colno", None)
    head, sep, tail = message.rpartition(" (at ")
    if sep:
        message, where = head, tail.rstrip(")")
        if lineno is None and where.startswith("line "):
            line_part, _, col_part = where.partition(", column ")
            lineno, colno = line_part.removeprefix("line "), col_part
        elif lineno is None:
            return f"{where}: {_lower_first(message)}"
    if lineno is None:
        return _lower_first(message)
    return f"line {lineno}, column {colno}: {_lower_first(message)}"


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:]


@dataclass(frozen=True)
class UserConfig:
    """The settings in the user's `config.toml`; every field optional."""

    default_pair: str | None = None
    """The pair `macspec run` and `macspec chat` use when given no model; None means "demo"."""


_CONFIG_KEYS = {"default_pair": str}


def load_config() -> UserConfig:
    """Read and validate the user config; a missing file is the default config."""
    path = config_path()
    if not path.is_file():
        return UserConfig()
    data = read_toml(path)
    for key, value in data.items():
        expected = _CONFIG_KEYS.get(key)
        if expected is None:
            known = ", ".join(sorted(_CONFIG_KEYS))
            raise MacspecError(f"{path}: unknown key '{key}' (known: {known})")
        if not isinstance(value, expected):
            raise MacspecError(
                f"{path}: '{key}' must be a {expected.__name__}, not {type(value).__name__}"
            )
    return UserConfig(**data)
