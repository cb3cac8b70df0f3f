"""A terminal that can go away: when its window closes, the chat ends as on SIGHUP.

After a hangup, writes to the terminal fail (EIO) and reads return nothing, with or without
a SIGHUP to say so. Textual's driver would lose its writer thread (then block the app on a
full output queue for good) or spin on the empty reads. This driver drops output once the
terminal is gone, checks for it twice a second even while nothing is drawn, and then takes
the app's hangup path: the answer saved as 'interrupted', exit 129.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from typing import Any

try:  # POSIX only (termios); elsewhere Textual's own driver is used unchanged
    from textual.drivers.linux_driver import LinuxDriver
except ImportError:  # pragma: no cover - not on macOS or Linux
    LinuxDriver = None  # type: ignore[assignment,misc]

PROBE_EVERY_S = 0.5
"""How often the terminal is checked for a hangup."""


class TerminalOut:
    """The terminal's output stream: once writing fails (the terminal is gone), writes are
    dropped instead of raising in Textual's writer thread, and `on_gone` is called once."""

    def __init__(self, stream: Any, on_gone: Callable[[], None]):
        self._stream, self._on_gone = stream, on_gone
        self.gone = False

    def _lost(self) -> None:
        if not self.gone:
            self.gone = True
            self._on_gone()

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                return self._stream.write(text)
            except OSError:
                self._lost()
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self._stream.flush()
            except OSError:
                self._lost()

    def probe(self) -> None:
        """An empty write: a hung-up terminal refuses even that."""
        if not self.gone:
            try:
                os.write(self._stream.fileno(), b"")
            except OSError:
                self._lost()

    def __getattr__(self, name: str) -> Any:  # fileno, isatty, encoding, ...
        return getattr(self._stream, name)


def hangup_safe(driver_class: type) -> type:
    """`driver_class` (Textual's POSIX driver) made safe for a terminal that goes away; any
    other driver is returned as it is. The app needs an `end_by_signal(signum)` method."""
    if LinuxDriver is None or not issubclass(driver_class, LinuxDriver):
        return driver_class

    class HangupSafeDriver(driver_class):  # type: ignore[misc,valid-type]
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self._watch_stop = threading.Event()
            # Textual's LinuxDriver writes through `_file` (in its writer thread).
            if hasattr(self, "_file"):
                self._file = TerminalOut(self._file, self._hung_up)

        def _hung_up(self) -> None:
            try:  # from a thread: call_later posts to the app's loop
                self._app.call_later(self._app.end_by_signal, signal.SIGHUP)
            except Exception:  # noqa: BLE001 - the app is already gone
                pass

        def start_application_mode(self) -> None:
            super().start_application_mode()
            if isinstance(getattr(self, "_file", None), TerminalOut):
                threading.Thread(target=self._watch, name="macspec-terminal", daemon=True).start()

        def _watch(self) -> None:
            while not self._watch_stop.wait(PROBE_EVERY_S):
                self._file.probe()

        def stop_application_mode(self) -> None:
            self._watch_stop.set()
            super().stop_application_mode()

        def run_input_thread(self) -> None:
            try:
                super().run_input_thread()
            except OSError:  # EIO on a read: the terminal is gone
                self._hung_up()

    return HangupSafeDriver
