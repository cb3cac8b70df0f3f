"""Status lines during long waits: 'reading the prompt' while a long prompt is prefilled, and
'reading FILE' while a GGUF's config and tokenizer are derived on its first use. On a
terminal, after a delay, until the wait ends; never on a pipe."""

from __future__ import annotations

import contextlib
import io
import time

from ggufkit import tiny_gguf
from rich.console import Console

from macspec.cli.notice import DelayedNotice
from macspec.models import hub
from macspec.models.gguf.report import announce_derivations


def terminal() -> tuple[Console, io.StringIO]:
    stream = io.StringIO()
    return Console(file=stream, force_terminal=True, width=80), stream


def test_a_long_wait_is_shown_until_it_ends():
    console, stream = terminal()
    notice = DelayedNotice(console, delay_s=0.0)
    notice.start("reading the prompt: 1,073 ids…")
    deadline = time.monotonic() + 5
    while "reading the prompt" not in stream.getvalue() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert "reading the prompt: 1,073 ids" in stream.getvalue()
    notice.stop()
    shown = len(stream.getvalue())
    time.sleep(0.3)
    assert len(stream.getvalue()) == shown  # stopped: nothing more is drawn


def test_a_short_wait_shows_nothing():
    console, stream = terminal()
    notice = DelayedNotice(console, delay_s=0.5)
    notice.start("reading the prompt: 300 ids…")
    notice.stop()  # the wait ended before the delay
    time.sleep(0.7)
    assert stream.getvalue() == ""


def test_nothing_on_a_pipe():
    piped = io.StringIO()
    notice = DelayedNotice(Console(file=piped, force_terminal=False), delay_s=0.0)
    notice.start("reading the prompt: 5,000 ids…")
    time.sleep(0.2)
    notice.stop()
    assert piped.getvalue() == ""


def test_a_gguf_first_use_is_announced_and_a_later_one_is_not(tmp_path, monkeypatch):
    monkeypatch.setenv("MACSPEC_HOME", str(tmp_path / "home"))
    path = tiny_gguf(tmp_path)
    heard = []

    def listener(file):
        heard.append(file)
        return contextlib.nullcontext()

    with announce_derivations(listener):
        first = hub.local_model_path(str(path))
        again = hub.local_model_path(str(path))
    assert first == again and heard == [path.resolve()]
