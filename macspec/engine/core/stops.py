"""Stop strings over streamed text: release text only once it cannot begin a stop string."""

from __future__ import annotations

from collections.abc import Iterable


class StopScanner:
    """Tracks how much of a growing text is safe to show, and where a stop string ends it."""

    def __init__(self, stop_strings: Iterable[str]):
        self.stops = [s for s in stop_strings if s]
        self.longest = max((len(s) for s in self.stops), default=0)
        self.released = 0
        """Characters of the text already handed out."""
        self.hit: str | None = None
        """The stop string that ended the text, once one did."""

    def feed(self, text: str) -> tuple[str, bool]:
        """Given the whole text so far, return (newly releasable text, whether a stop was hit)."""
        if self.stops:
            start = max(0, self.released - self.longest + 1)
            hits = [(i, s) for s in self.stops if (i := text.find(s, start)) >= 0]
            if hits:
                at, self.hit = min(hits, key=lambda h: h[0])
                return self._release(text, at), True
        held = 0
        for stop in self.stops:
            for size in range(min(len(stop) - 1, len(text)), held, -1):
                if text.endswith(stop[:size]):
                    held = size
                    break
        return self._release(text, max(self.released, len(text) - held)), False

    def flush(self, text: str) -> str:
        """At the end with no stop hit: everything left is released."""
        return self._release(text, len(text))

    def _release(self, text: str, end: int) -> str:
        delta = text[self.released : end]
        self.released = max(self.released, end)
        return delta
