"""SIGTERM, SIGHUP and SIGINT (kill -INT) sent to a real `macspec chat` in a pseudo-terminal,
mid-answer: the partial answer is saved as 'interrupted', the terminal is restored, the exit
code is 128+n.
A terminal closed under it (reads and writes fail, with or without a SIGHUP) is a hangup."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import signal
import sqlite3
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

LEAVE_ALTERNATE_SCREEN = b"\x1b[?1049l"
MOUSE_TRACKING_OFF = b"\x1b[?1000l"
SHOW_CURSOR = b"\x1b[?25h"


class Terminal:
    """A child process on the slave side of a pty; the test reads the master side."""

    def __init__(self, argv: list[str], env: dict[str, str]):
        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        self.process = subprocess.Popen(
            argv, stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True
        )
        os.close(slave)
        self.output = bytearray()
        self.open = True

    def read(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while self.open and time.monotonic() < end:
            ready, _, _ = select.select([self.master], [], [], 0.05)
            if not ready:
                continue
            try:
                data = os.read(self.master, 65536)
            except OSError:  # the child closed its side
                data = b""
            if not data:
                return
            self.output.extend(data)

    def wait_for(self, text: bytes, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output:
            assert time.monotonic() < deadline, f"no {text!r} on screen: {bytes(self.output)!r}"
            assert self.process.poll() is None, bytes(self.output)
            self.read(0.1)

    def hang_up(self) -> None:
        """Close the terminal, as closing its window does."""
        os.close(self.master)
        self.open = False

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        if self.open:
            os.close(self.master)


def answer_row(database: Path) -> tuple[str, int, str | None] | None:
    try:
        with sqlite3.connect(database) as db:
            return db.execute(
                "SELECT content, complete, finish_reason FROM messages WHERE role = 'assistant'"
            ).fetchone()
    except sqlite3.Error:
        return None


@pytest.mark.parametrize(
    "signum, hang_up",
    [
        (signal.SIGTERM, False),
        (signal.SIGHUP, False),
        (signal.SIGINT, False),
        (signal.SIGHUP, True),
        (None, True),
    ],
    ids=["SIGTERM", "SIGHUP", "SIGINT", "SIGHUP, terminal closed", "terminal closed, no signal"],
)
def test_a_signal_mid_answer_saves_it_restores_the_terminal_and_exits_128_plus_n(
    tmp_path, tiny_model_folder, signum, hang_up
):
    home = tmp_path / "home"
    env = dict(os.environ, MACSPEC_HOME=str(home), TERM="xterm-256color")
    folder = str(tiny_model_folder)
    argv = [sys.executable, "-m", "macspec", "chat", "--model", folder, "--draft-model", folder]
    terminal = Terminal([*argv, "--max-tokens", "100000"], env)
    try:
        terminal.wait_for(b"Quit", timeout=90)  # the footer: the app is up
        terminal.read(0.5)
        os.write(terminal.master, b"hello there\r")
        deadline = time.monotonic() + 60
        while not ((row := answer_row(home / "chats.db")) and len(row[0]) >= 20):
            assert time.monotonic() < deadline, "the answer never got going"
            terminal.read(0.1)
        streamed_so_far = row[0]

        shown_until = len(terminal.output)
        if hang_up:
            terminal.hang_up()
        if signum is not None:
            terminal.process.send_signal(signum)
        deadline = time.monotonic() + 30
        while terminal.process.poll() is None:
            assert time.monotonic() < deadline, "it did not exit"
            terminal.read(0.1) if terminal.open else time.sleep(0.1)
        terminal.read(0.5)
        code = terminal.process.returncode
        assert code == 128 + (signum or signal.SIGHUP), bytes(terminal.output[-3000:])

        content, complete, finish_reason = answer_row(home / "chats.db")
        assert (complete, finish_reason) == (0, "interrupted")
        assert content.startswith(streamed_so_far) and len(content) >= len(streamed_so_far)
        if not hang_up:
            after = bytes(terminal.output[shown_until:])
            assert LEAVE_ALTERNATE_SCREEN in after and MOUSE_TRACKING_OFF in after
            assert SHOW_CURSOR in after[after.rindex(LEAVE_ALTERNATE_SCREEN) :]
            assert b"Traceback" not in terminal.output
            assert b"conversation 1 saved" in after
    finally:
        terminal.close()
