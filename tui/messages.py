"""Messages the app's thread workers post to the UI thread (post_message is thread-safe)."""

from __future__ import annotations

from textual.message import Message

from macspec.chat.session import ChatModels
from macspec.engine.core.events import Done, Source
from tui.live import Figures


class Started(Message):
    """The answer is about to stream; how a thinking model's text starts (see ChatSession)."""

    def __init__(self, reasoning_start: bool | None) -> None:
        super().__init__()
        self.reasoning_start = reasoning_start


class Chunk(Message):
    """New text pieces of the answer streaming, with the figures so far."""

    def __init__(self, pieces: list[tuple[str, Source]], figures: Figures) -> None:
        super().__init__()
        self.pieces, self.figures = pieces, figures


class Finished(Message):
    """The answer ended (done is None when it crashed, error says why, or was interrupted).
    `not_saved` is why it is not stored as it ended (it is kept in memory), else None."""

    def __init__(
        self,
        done: Done | None,
        figures: Figures,
        error: str | None,
        not_saved: str | None = None,
    ) -> None:
        super().__init__()
        self.done, self.figures, self.error = done, figures, error
        self.not_saved = not_saved


class Rejected(Message):
    """The message was refused before anything was saved (too long for the context)."""

    def __init__(self, text: str, reason: str) -> None:
        super().__init__()
        self.text, self.reason = text, reason


class Saved(Message):
    """A retry to save what storage refused ended; `problem` is None when all is saved."""

    def __init__(self, count: int, problem: str | None) -> None:
        super().__init__()
        self.count, self.problem = count, problem


class Noticed(Message):
    """Something the user should read in the transcript (context trimmed)."""

    def __init__(self, text: str, kind: str) -> None:
        super().__init__()
        self.text, self.kind = text, kind


class PairLoaded(Message):
    """Another pair is loaded and ready."""

    def __init__(self, models: ChatModels) -> None:
        super().__init__()
        self.models = models


class PairFailed(Message):
    """Loading another pair failed (the current one stays)."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__()
        self.name, self.reason = name, reason
