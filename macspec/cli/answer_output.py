"""Where `run` writes its answer: stdout, reasoning marked, and what a failed write means (a
reader gone away is a quiet exit 0; a full disk is one line)."""

from __future__ import annotations

import io
import os
import sys
from typing import NoReturn

from macspec.cli.app import fail
from macspec.errors import QuietExit


class ReasoningWriter:
    """Writes an answer to a stream, its reasoning marked: dim on a terminal, else between
    <think> tags as the model wrote it."""

    DIM, RESET = "\x1b[2m", "\x1b[0m"

    def __init__(self, stream, dim: bool):
        self.stream, self.dim = stream, dim
        self._in_reasoning = False
        self.ends_with_newline = True

    def write(self, part) -> None:
        """A plain text delta, or a Split of reasoning and answer."""
        if isinstance(part, str):
            self._emit(part)
            return
        if part.reasoning:
            if not self._in_reasoning:
                self._emit(self.DIM if self.dim else "<think>\n")
                self._in_reasoning = True
            self._emit(part.reasoning)
        if part.answer:
            self.close()
            self._emit(part.answer)

    def close(self) -> None:
        """End a reasoning block that is open."""
        if self._in_reasoning:
            self._in_reasoning = False
            newline = "" if self.ends_with_newline else "\n"
            self._emit(self.RESET + newline + "\n" if self.dim else newline + "</think>\n\n")

    def emit_line(self, text: str) -> None:
        """Text and a newline, outside any reasoning block."""
        self._emit(text + "\n")

    def _emit(self, text: str) -> None:
        if text:
            try:
                self.stream.write(text)
                self.stream.flush()
            except OSError as exc:
                raise StdoutFailed(exc) from exc
            self.ends_with_newline = text.endswith("\n")


def silence_stdout() -> None:
    """Point stdout at /dev/null: Python flushes it again at exit, which would fail again."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        pass  # not a file (tests)


class StdoutFailed(Exception):
    """Writing the answer failed: the reader went away (`| head -1`), or the disk is full."""

    def __init__(self, error: OSError):
        super().__init__(error)
        self.error = error


def stdout_failed(failure: StdoutFailed) -> NoReturn:
    """The reader went away: stop, quietly, exit 0 (it had what it wanted, as with ripgrep).
    Any other failure to write (a full disk) is one line."""
    silence_stdout()
    if isinstance(failure.error, BrokenPipeError):
        raise QuietExit(0)
    fail(f"cannot write the answer to stdout ({failure.error.strerror or failure.error})")
