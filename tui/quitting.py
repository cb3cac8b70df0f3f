"""How the chat ends: esc stops an answer, ctrl+q quits, and SIGTERM, SIGHUP or SIGINT end it
cleanly. Every way out lets a running answer stop and be saved first, and text typed but not
sent is never thrown away by a single key.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from typing import TYPE_CHECKING

from textual.app import App
from textual.worker import Worker

if TYPE_CHECKING:
    from tui.widgets.prompt import PromptInput
    from tui.widgets.stats_bar import StatsBar

STOP_WAIT_S = 10
"""How long quitting waits for a running answer to stop and be saved."""
QUIT_CONFIRM_S = 5
"""With unsent text in the prompt, a second ctrl+q within this many seconds quits."""
EXIT_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
"""Signals that end the chat cleanly: the answer saved, the terminal restored."""


class Quitting(App):
    """The stop, quit and signal actions of the chat app (tui/app.py's ChatApp)."""

    # What it uses of ChatApp's.
    generating: bool
    prompt: PromptInput
    stats_bar: StatsBar
    _cancel: threading.Event
    _worker: Worker | None

    def __init__(self) -> None:
        super().__init__()
        self.exit_signal: int | None = None
        """The signal that ended the app, if one did."""
        self._interrupt = threading.Event()
        """Set by a signal: the running answer closes at its next event, saved 'interrupted'."""
        self._quit_asked_at = float("-inf")
        """When ctrl+q last asked to confirm (unsent text): never, so far."""

    def listen_for_exit_signals(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in EXIT_SIGNALS:
            loop.add_signal_handler(signum, self.end_by_signal, signum)

    def action_stop(self) -> None:
        if self.generating and not self._cancel.is_set():
            self._cancel.set()  # the engine polls it after every token
            self.stats_bar.set_state("stopping")

    async def _stop_answer(self, cancel: bool = True) -> None:
        """Let a running answer stop and be saved before the process goes (`cancel`: as Esc
        does; else the worker closes it at the next event, saved as 'interrupted')."""
        if self.generating and self._worker is not None:
            if cancel:
                self._cancel.set()
            try:
                await asyncio.wait_for(self._worker.wait(), timeout=STOP_WAIT_S)
            except (asyncio.TimeoutError, Exception):
                pass

    async def action_quit(self) -> None:
        # Text typed and not sent is not in the history: one ctrl+q must not throw it away.
        if self.prompt.text.strip():
            now = time.monotonic()
            if now - self._quit_asked_at > QUIT_CONFIRM_S:
                self._quit_asked_at = now
                self.notify(
                    "Your message is not sent: ctrl+q again to quit without it.",
                    severity="warning",
                    timeout=QUIT_CONFIRM_S,
                )
                return
        await self._stop_answer()
        self.exit()

    def end_by_signal(self, signum: int) -> None:
        """SIGTERM, SIGHUP or SIGINT (or the terminal gone): the answer stops ('interrupted',
        saved), then the app exits the normal way, which restores the terminal."""
        if self.exit_signal is not None:
            return
        self.exit_signal = signum
        self._interrupt.set()

        async def close() -> None:
            await self._stop_answer(cancel=False)
            self.exit(return_code=128 + signum)

        self.run_worker(close(), group="signal")
