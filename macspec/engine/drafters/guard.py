"""A drafter is only a guesser: its failure must never fail an answer.

Every call the engine makes into a drafter (start, propose, rollback, add_hidden, a tree's
release) goes through the request's `DrafterGuard`. The first exception is logged once, with
its traceback, and switches the drafter off for the rest of the request: decoding goes on
plainly, and the output is the target's as always (what the target alone would produce does
not depend on what was guessed). A failure in the target itself is not caught here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

log = logging.getLogger("macspec.engine")

T = TypeVar("T")

REASON_CHARS = 160
"""The longest message kept in the reason (stats lines stay one line)."""


class DrafterGuard:
    """One request's watch over its drafter's calls."""

    def __init__(self, name: str):
        self.name = name
        self.reason: str | None = None
        """Why the drafter was switched off in this request, or None: it is on."""

    @property
    def on(self) -> bool:
        return self.reason is None

    def reset(self) -> None:
        """A new request: the drafter gets another chance."""
        self.reason = None

    def call(self, what: str, fn: Callable[..., T], *args) -> T | None:
        """fn(*args), or None once the drafter is off (now or before)."""
        if self.reason is not None:
            return None
        try:
            return fn(*args)
        except Exception as exc:  # any failure of a guesser is survivable
            self.fail(what, exc)
            return None

    def fail(self, what: str, exc: BaseException) -> None:
        """Switch the drafter off, saying why once (with the traceback in the log)."""
        if self.reason is not None:
            return
        message = " ".join(str(exc).split())[:REASON_CHARS]
        detail = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
        self.reason = f"{self.name} drafter switched off ({detail} in {what})"
        log.warning("%s; decoding goes on plainly", self.reason, exc_info=exc)
