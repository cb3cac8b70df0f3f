"""One chat turn off the UI thread: the session's events streamed into Messages, and the
summary line an answer ends with.

`run_turn` runs in the app's thread worker. Whatever happens (a refused message, a storage
failure, a crash in the model, a signal) it posts exactly one Rejected or Finished, so the
chat never stays "answering".
"""

from __future__ import annotations

import time
from collections.abc import Callable

from textual.message import Message

from macspec.chat.session import ChatSession, ContextTrimmed, NotSaved
from macspec.chat.store import ModelInfo, StoredMessage
from macspec.engine.core.events import Done, Token
from macspec.engine.core.stats import acceptance_text, summary_line, token_count
from macspec.errors import MacspecError
from tui.live import LiveFigures, without_timings
from tui.messages import Chunk, Finished, Noticed, Rejected, Started

POST_EVERY_S = 1 / 15
"""Most often the worker posts token pieces to the UI: smooth to the eye, while each redraw
takes the GIL from the generating thread (scripts/tui_overhead.py: 30/s cost 5% more)."""


def run_turn(
    session: ChatSession,
    text: str,
    cancelled: Callable[[], bool],
    interrupted: Callable[[], bool],
    post: Callable[[Message], object],
) -> None:
    """Send `text` and post the answer as it streams. `cancelled` (Esc) ends it as the engine
    does ('cancelled'); `interrupted` (a signal) closes it, saved as 'interrupted'."""
    try:
        events = session.send(text, cancelled)
    except MacspecError as exc:  # refused (too long, empty): nothing was kept
        post(Rejected(text, str(exc)))
        return
    except Exception as exc:  # a bug; still, the chat must not stay "answering"
        post(Rejected(text, f"{type(exc).__name__}: {exc}"))
        return
    post(Started(session.reasoning_start))
    live, pieces, posted = LiveFigures(), [], time.monotonic()
    done, error = None, None
    try:
        for event in events:  # to the end: the session saves the answer as it finishes
            live.add(event)
            if isinstance(event, ContextTrimmed):
                post(Noticed(event.text, "warning"))
            elif isinstance(event, NotSaved):
                post(Noticed(event.text, "error"))
            elif isinstance(event, Token):
                pieces.append((event.text, event.source))
            elif isinstance(event, Done):
                done = event
            if pieces and time.monotonic() - posted >= POST_EVERY_S:
                post(Chunk(pieces, live.figures()))
                pieces, posted = [], time.monotonic()
            if interrupted():  # saved as 'interrupted' when closed below
                break
    except Exception as exc:  # a crash mid-answer: saved as far as it got, shown, not fatal
        error = f"{type(exc).__name__}: {exc}"
    finally:
        try:
            events.close()
        except Exception as exc:  # noqa: BLE001 - the turn must still end
            error = error or f"{type(exc).__name__}: {exc}"
        post(Chunk(pieces, live.figures()))
        saved = session.answer_saved
        problem = None if saved else str(session.journal.problem or "not saved")
        post(Finished(done, live.figures(), error, problem))


def answer_summary(message: Finished, mask_timings: bool = False) -> tuple[str, str]:
    """(the line under a finished answer, the text still to append to it)."""
    done = message.done
    if done is not None:
        stats = without_timings(done.stats) if mask_timings else done.stats
        cancelled = done.finish_reason == "cancelled"
        # Esc's answer ends with its finish reason, as README and `run --json` name it:
        # 'cancelled, saved as incomplete'
        summary = summary_line(stats, done.finish_reason)
        if mask_timings:
            summary = summary.replace("ttft 0.00s", "ttft ··")
        if cancelled and not message.not_saved:
            summary += ", saved as incomplete"
        tail = done.tail
    elif message.error is None:  # interrupted (a signal): the app is closing
        summary, tail = "interrupted", ""
    else:
        summary = f"error: {message.error}"
        summary += "" if message.not_saved else " · saved as incomplete"
        tail = ""
    if message.not_saved:
        summary += " · not saved (kept in memory; ctrl+s retries)"
    return summary, tail


def stored_summary(message: StoredMessage) -> str:
    """The summary line of an answer loaded from the store (no timings: it is history)."""
    stats = message.stats or {}
    parts = [token_count(message.token_count or 0)]
    if stats.get("draft_proposed"):
        parts.append(acceptance_text(stats.get("draft_accepted") or 0, stats["draft_proposed"]))
    elif stats.get("plain_reason"):
        parts.append(stats["plain_reason"])
    if stats.get("tokens_per_pass") is not None:
        parts.append(f"{stats['tokens_per_pass']:.2f} tokens/pass")
    reason = message.finish_reason or "?"
    if reason == "cancelled":  # worded as it was when the answer was stopped
        parts.append("cancelled, saved as incomplete")
    else:
        parts.append(reason + ("" if message.complete else ", incomplete"))
    return " · ".join(parts)


def in_memory(message: dict[str, str]) -> StoredMessage:
    """A message the session holds, shown as if it had been read back."""
    role, content = message["role"], message["content"]
    return StoredMessage(0, role, content, True, None, None, None, ModelInfo(), 0.0)
