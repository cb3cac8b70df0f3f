"""run's 'reading the prompt' notice: on a terminal, after its delay, until the answer starts;
never on a pipe, and never for a prompt the caches held whole."""

from __future__ import annotations

import io
import time

from rich.console import Console

from macspec.cli.answer_output import PrefillNotice


def terminal() -> tuple[Console, io.StringIO]:
    stream = io.StringIO()
    return Console(file=stream, force_terminal=True, width=80), stream


def test_a_long_prefill_is_shown_until_the_answer_starts():
    console, stream = terminal()
    notice = PrefillNotice(console, delay_s=0.0)
    notice.start(1073)
    deadline = time.monotonic() + 5
    while "reading the prompt" not in stream.getvalue() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert "reading the prompt: 1,073 ids" in stream.getvalue()
    notice.stop()
    shown = len(stream.getvalue())
    time.sleep(0.3)
    assert len(stream.getvalue()) == shown  # stopped: nothing more is drawn


def test_a_quick_prefill_shows_nothing():
    console, stream = terminal()
    notice = PrefillNotice(console, delay_s=0.5)
    notice.start(300)
    notice.stop()  # the first token came before the delay
    time.sleep(0.7)
    assert stream.getvalue() == ""


def test_nothing_on_a_pipe_or_for_a_cached_prompt():
    piped = io.StringIO()
    notice = PrefillNotice(Console(file=piped, force_terminal=False), delay_s=0.0)
    notice.start(5000)
    time.sleep(0.2)
    notice.stop()
    console, stream = terminal()
    cached = PrefillNotice(console, delay_s=0.0)
    cached.start(0)
    time.sleep(0.2)
    cached.stop()
    assert piped.getvalue() == "" and stream.getvalue() == ""
