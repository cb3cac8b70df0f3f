"""A status line on a terminal's stderr during a wait long enough to wonder about (a long
prompt's prefill on a CPU, a big GGUF's first use), shown only from a delay on and gone when
the wait ends; nothing on a pipe."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console


class DelayedNotice:
    """`start(text)` shows `text` with a spinner `delay_s` later, unless `stop()` came first."""

    def __init__(self, console: Console | None = None, delay_s: float = 1.0):
        self.console = console if console is not None else Console(stderr=True)
        self.delay_s = delay_s
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._status = None

    def start(self, text: str) -> None:
        if not self.console.is_terminal:
            return
        self._timer = threading.Timer(self.delay_s, self._show, (text,))
        self._timer.daemon = True
        self._timer.start()

    def _show(self, text: str) -> None:
        with self._lock:
            if self._timer is not None:  # not stopped meanwhile
                self._status = self.console.status(text)
                self._status.start()

    def stop(self) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if self._status is not None:
                self._status.stop()
                self._status = None


@contextmanager
def deriving_notice(path: Path) -> Iterator[None]:
    """While a GGUF file's config and tokenizer are derived on its first use."""
    notice = DelayedNotice()
    notice.start(f"reading {path.name}: its metadata and tokenizer (first use)…")
    try:
        yield
    finally:
        notice.stop()
