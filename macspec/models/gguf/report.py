"""What loading a GGUF file did to its tensors, as data for the caller to show: which types were
converted exactly and which kept as float16, the converted model's size in memory against the
file's, and the conversion's progress. The loader reports into the `watch_loads` its caller
opened around the load (none open: nothing is kept, nothing is drawn).

A context variable rather than an argument through every loader: run, chat, bench and serve
reach the GGUF loader through several layers, and only the CLI shows what it reports. A thread
starts with no watch, so a load in a UI worker draws nothing on the terminal it does not own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Progress = Callable[[str, int, int], None]
"""(the file's name, bytes of tensor data converted so far, of how many)."""


@dataclass(frozen=True)
class Conversion:
    """One GGUF file as a load read it."""

    file: Path
    exact: dict[str, int]
    """Tensors by type converted bit for bit (floats and the affine group-32 types)."""
    inexact: dict[str, int]
    """Tensors by type dequantized and kept as float16 (no exact MLX form)."""
    converted: bool
    """This load converted the file (its first); False: read from the converted cache, or
    a file of only the types `mx.load` reads (nothing to convert)."""
    file_bytes: int
    resident_bytes: int
    """The converted weights' bytes in memory (estimated from the header)."""
    layout: str = "compact"
    """The layout the tensors took (`layout.Layout`)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "file": str(self.file),
            "exact": self.exact,
            "inexact": self.inexact,
            "converted": self.converted,
            "file_bytes": self.file_bytes,
            "resident_bytes": self.resident_bytes,
            "layout": self.layout,
        }


@dataclass
class _Watch:
    conversions: list[Conversion] = field(default_factory=list)
    progress: Progress | None = None


_current: ContextVar[_Watch | None] = ContextVar("macspec_gguf_watch", default=None)


@contextmanager
def watch_loads(progress: Progress | None = None) -> Iterator[list[Conversion]]:
    """The GGUF files loaded inside the block, in load order (the list fills as they load);
    `progress` is called as a file is converted (never for a cached or native one)."""
    watch = _Watch(progress=progress)
    token = _current.set(watch)
    try:
        yield watch.conversions
    finally:
        _current.reset(token)


def reported(conversion: Conversion) -> None:
    """Tell the open watch, if any, what a load did."""
    watch = _current.get()
    if watch is not None:
        watch.conversions.append(conversion)


def progress_callback() -> Progress | None:
    """The open watch's progress callback, if any."""
    watch = _current.get()
    return watch.progress if watch is not None else None


DerivingListener = Callable[[Path], AbstractContextManager[None]]
"""Around a file's first use, while its config and tokenizer are derived (seconds for a
large vocabulary): what the caller shows meanwhile."""
_deriving: ContextVar[DerivingListener | None] = ContextVar("macspec_gguf_deriving", default=None)


@contextmanager
def announce_derivations(listener: DerivingListener) -> Iterator[None]:
    """Inside the block, each GGUF file's first-use derivation runs inside `listener(path)`."""
    token = _deriving.set(listener)
    try:
        yield
    finally:
        _deriving.reset(token)


@contextmanager
def deriving(path: Path) -> Iterator[None]:
    """A file's derivation, inside the announced listener if any."""
    listener = _deriving.get()
    if listener is None:
        yield
        return
    with listener(path):
        yield
