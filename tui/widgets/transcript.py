"""The transcript: user messages, answers (Markdown, streamed), notices; kept at the bottom.

An answer is two views of the same text, kept in step while it streams:
- `.body`, a Markdown widget fed through Textual's MarkdownStream (appends, batched when
  tokens come faster than it renders; never re-rendered whole per token);
- `.spans`, a Static of the raw text as coloured spans: tokens from accepted draft guesses
  in one colour, the target's own tokens in another (appending to one rich Text is cheap).
With the source colours on (the default; a key toggles them) the spans view is shown,
otherwise the rendered Markdown. Answers loaded from history have no per-token sources
and always show Markdown.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.containers import Vertical, VerticalScroll
from textual.widgets import Markdown, Static
from textual.widgets.markdown import MarkdownStream

from macspec.engine.events import Source


class UserMessage(Static):
    """What the user typed."""

    def __init__(self, text: str) -> None:
        super().__init__(Text(text), classes="user-message")
        self.text = text


class Notice(Static):
    """A line from macspec itself: context trimmed, a warning, an error."""

    def __init__(self, text: str, kind: str = "info") -> None:
        super().__init__(Text(text), classes=f"notice -{kind}")
        self.text = text


class AnswerMessage(Vertical):
    """One answer: Markdown body, source-coloured spans, and a one-line summary."""

    COMPONENT_CLASSES = {"answer--draft", "answer--target"}

    def __init__(self, text: str = "", summary: str = "", live: bool = True) -> None:
        super().__init__(classes="answer" + (" -has-sources" if live else ""))
        self.text = text
        """The answer so far (what the Markdown body holds)."""
        self.summary = summary
        self._initial = text
        self._spans = Text()
        self._stream: MarkdownStream | None = None
        self.draft_tokens = 0
        self.target_tokens = 0

    def compose(self):
        yield Markdown(self._initial, classes="body")
        yield Static(self._spans, classes="spans")
        yield Static(Text(self.summary), classes="summary")

    @property
    def plain_spans(self) -> list[tuple[str, str]]:
        """(text, 'draft'|'target') runs, for tests."""
        draft = self.get_component_rich_style("answer--draft")
        return [
            (self._spans.plain[s.start : s.end], "draft" if s.style == draft else "target")
            for s in self._spans.spans
        ]

    async def add_tokens(self, pieces: Sequence[tuple[str, Source]]) -> None:
        """Append released text pieces, each with the source of its token."""
        styles = {
            Source.DRAFT: self.get_component_rich_style("answer--draft"),
            Source.TARGET: self.get_component_rich_style("answer--target"),
        }
        for text, source in pieces:
            if source is Source.DRAFT:
                self.draft_tokens += 1
            else:
                self.target_tokens += 1
            if text:
                self._spans.append(text, styles[source])
        self.query_one(".spans", Static).update(self._spans)
        await self._write("".join(text for text, _ in pieces))

    async def _write(self, fragment: str) -> None:
        if not fragment:
            return
        self.text += fragment
        if self._stream is None:
            self._stream = Markdown.get_stream(self.query_one(".body", Markdown))
        await self._stream.write(fragment)

    async def finish(self, tail: str, summary: str) -> None:
        """The answer ended: flush held-back text, stop the stream, show the summary."""
        if tail:
            await self.add_tokens([(tail, Source.TARGET)])
            self.target_tokens -= 1  # the tail is text released late, not a token
        if self._stream is not None:
            await self._stream.stop()
            self._stream = None
        self.set_summary(summary)

    def set_summary(self, summary: str) -> None:
        self.summary = summary
        self.query_one(".summary", Static).update(Text(summary))


class Transcript(VerticalScroll):
    """The conversation so far; anchored, so it follows new text until the user scrolls up."""

    def on_mount(self) -> None:
        self.anchor()

    async def add_user(self, text: str) -> UserMessage:
        message = UserMessage(text)
        await self.mount(message)
        return message

    async def add_answer(self, text: str = "", summary: str = "", live: bool = True):
        answer = AnswerMessage(text, summary, live=live)
        await self.mount(answer)
        return answer

    async def add_notice(self, text: str, kind: str = "info", before=None) -> Notice:
        notice = Notice(text, kind)
        await self.mount(notice, before=before)
        return notice

    async def clear(self) -> None:
        await self.remove_children()
