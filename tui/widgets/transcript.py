"""The transcript: user messages, answers (Markdown, streamed), notices; kept at the bottom.

An answer is two views of the same text:
- `.body`, a Markdown widget fed through Textual's MarkdownStream while it is the view shown
  (appends, batched when tokens come faster than it renders); while the spans show, it is not
  parsed at all, and catches up in one update when shown (ctrl+t) or when the answer ends;
- `.spans`, a Static of the raw text as coloured spans: tokens from accepted draft guesses
  in one colour, the target's own tokens in another (appending to one rich Text is cheap).
With the source colours on (the default; a key toggles them) the spans view is shown,
otherwise the rendered Markdown, unless the answer is not Markdown at all (unfenced code, plain
text): then a preformatted view that keeps its line breaks and indentation. Answers loaded from
history bring their stored sources and show coloured as they did.

A thinking model's reasoning goes to a collapsed section above the answer (ctrl+o opens it),
split from the streamed text by the same rule the session stores it by.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from rich.text import Text
from textual.containers import Vertical, VerticalScroll
from textual.widgets import Collapsible, Markdown, Static
from textual.widgets.markdown import MarkdownStream

from macspec.chat.records import StoredMessage
from macspec.engine.core.events import Source
from macspec.models.reasoning import ReasoningSplitter
from tui.turn import stored_summary

REASONING_TITLE = "reasoning (ctrl+o)"
_MARKDOWN = re.compile(
    r"^\s{0,3}(```|~~~|#{1,6}\s|[-*+]\s|\d+[.)]\s|>\s|\|.*\|)|\*\*\S|\[[^\]]+\]\(", re.M
)


def looks_like_markdown(text: str) -> bool:
    """Whether text uses Markdown (fences, headings, lists, quotes, tables, bold, links); code
    or prose without any of it is shown preformatted, as written."""
    return bool(_MARKDOWN.search(text))


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

    def __init__(
        self,
        text: str = "",
        summary: str = "",
        live: bool = True,
        reasoning: str | None = None,
        sources: Sequence[Sequence[str]] | None = None,
    ) -> None:
        coloured = live or bool(sources)
        super().__init__(classes="answer" + (" -has-sources" if coloured else ""))
        self.text = text
        """The answer so far (what the Markdown body holds)."""
        self.summary = summary
        self.reasoning = reasoning or ""
        """A thinking model's reasoning so far, shown apart and collapsed."""
        self._initial = text
        self._stored_sources = list(sources or [])
        self._spans = Text()
        self._stream: MarkdownStream | None = None
        self._views_behind = False
        """Text written while only the coloured view showed, not yet in the Markdown one."""
        self._splitter: ReasoningSplitter | None = None
        self.draft_tokens = 0
        self.target_tokens = 0

    def compose(self):
        with Collapsible(title=REASONING_TITLE, collapsed=True, classes="reasoning"):
            yield Static(Text(self.reasoning), classes="reasoning-text")
        yield Markdown(self._initial, classes="body")
        yield Static(self._spans, classes="spans")
        yield Static(Text(self._initial), classes="plain")
        yield Static(Text(self.summary), classes="summary")

    @property
    def plain_spans(self) -> list[tuple[str, str]]:
        """(text, 'draft'|'target') runs, for tests."""
        draft = self.get_component_rich_style("answer--draft")
        return [
            (self._spans.plain[s.start : s.end], "draft" if s.style == draft else "target")
            for s in self._spans.spans
        ]

    def on_mount(self) -> None:
        self._show_reasoning()
        self.set_class(not looks_like_markdown(self.text), "-plain")
        if self._stored_sources:  # an answer from history, coloured as it was written
            styles = {
                "draft": self.get_component_rich_style("answer--draft"),
                "target": self.get_component_rich_style("answer--target"),
            }
            for text, source in self._stored_sources:
                self._spans.append(text, styles.get(source, styles["target"]))
            self.query_one(".spans", Static).update(self._spans)

    def split_reasoning(self, starts_inside: bool | None) -> None:
        """From now on, text is reasoning or answer as a thinking model writes it (None: the
        model has no think tags, all text is answer)."""
        self._splitter = ReasoningSplitter(starts_inside) if starts_inside is not None else None

    def _show_reasoning(self) -> None:
        self.query_one(".reasoning", Collapsible).display = bool(self.reasoning.strip())
        self.query_one(".reasoning-text", Static).update(Text(self.reasoning.strip("\n")))

    async def add_tokens(self, pieces: Sequence[tuple[str, Source]]) -> None:
        """Append released text pieces, each with the source of its token."""
        styles = {
            Source.DRAFT: self.get_component_rich_style("answer--draft"),
            Source.TARGET: self.get_component_rich_style("answer--target"),
        }
        answer, thought = [], ""
        for text, source in pieces:
            if source is Source.DRAFT:
                self.draft_tokens += 1
            else:
                self.target_tokens += 1
            if self._splitter is not None:
                split = self._splitter.feed(text)
                thought, text = thought + split.reasoning, split.answer
            if text:
                self._spans.append(text, styles[source])
                answer.append(text)
        if thought:
            self.reasoning += thought
            self._show_reasoning()
        self.query_one(".spans", Static).update(self._spans)
        await self._write("".join(answer))

    @property
    def _coloured_view(self) -> bool:
        """Whether the source-coloured spans are what shows (the Markdown view is hidden)."""
        return self.has_class("-has-sources") and self.app.has_class("-sources")

    async def _write(self, fragment: str) -> None:
        if not fragment:
            return
        start = max(0, len(self.text) - 200)  # a marker may straddle the fragment's start
        self.text += fragment
        if self.has_class("-plain") and looks_like_markdown(self.text[start:]):
            self.set_class(False, "-plain")  # once Markdown, it stays Markdown
        if self._coloured_view or self.has_class("-plain"):
            # The Markdown body is not what shows: parsing it costs the generating thread the
            # GIL, so it catches up at once when shown (ctrl+t, the answer turning Markdown)
            # or when the answer ends.
            self._views_behind = True
            if not self._coloured_view:
                self.query_one(".plain", Static).update(Text(self.text))
            return
        if self._views_behind:
            await self.catch_up()  # the whole text, this fragment included
            return
        if self._stream is None:
            self._stream = Markdown.get_stream(self.query_one(".body", Markdown))
        await self._stream.write(fragment)

    async def catch_up(self) -> None:
        """Bring the hidden views (Markdown, preformatted) up to the text so far."""
        if self.has_class("-plain"):
            self.query_one(".plain", Static).update(Text(self.text))
        if self._views_behind:
            self._views_behind = False
            if self._stream is not None:
                await self._stream.stop()
                self._stream = None
            await self.query_one(".body", Markdown).update(self.text)

    async def finish(self, tail: str, summary: str) -> None:
        """The answer ended: flush held-back text, stop the stream, show the summary."""
        if tail:
            await self.add_tokens([(tail, Source.TARGET)])
            self.target_tokens -= 1  # the tail is text released late, not a token
        if self._splitter is not None:  # text held back for a tag that never came
            held = self._splitter.flush()
            self.reasoning += held.reasoning
            self._show_reasoning()
            if held.answer:
                self._spans.append(held.answer, self.get_component_rich_style("answer--target"))
                self.query_one(".spans", Static).update(self._spans)
                await self._write(held.answer)
        if self._stream is not None:
            await self._stream.stop()
            self._stream = None
        self._views_behind = True  # the final text, whichever view shows
        await self.catch_up()
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

    async def add_stored(self, messages: Sequence[StoredMessage]) -> None:
        """A conversation read back from the store: its turns, each answer with its stored
        summary, reasoning and sources (coloured as when it was written)."""
        for message in messages:
            if message.role == "user":
                await self.add_user(message.content)
            elif message.role == "assistant":
                await self.add_answer(
                    message.content,
                    stored_summary(message),
                    live=False,
                    reasoning=message.reasoning,
                    sources=message.sources,
                )

    async def add_answer(
        self,
        text: str = "",
        summary: str = "",
        live: bool = True,
        reasoning: str | None = None,
        sources: Sequence[Sequence[str]] | None = None,
    ):
        answer = AnswerMessage(text, summary, live=live, reasoning=reasoning, sources=sources)
        await self.mount(answer)
        return answer

    async def add_notice(self, text: str, kind: str = "info", before=None) -> Notice:
        notice = Notice(text, kind)
        await self.mount(notice, before=before)
        return notice

    async def clear(self) -> None:
        await self.remove_children()

    def toggle_reasoning(self) -> None:
        """Open every reasoning section if one is closed, else close them all."""
        sections = list(self.query(".reasoning").results(Collapsible))
        opening = any(section.collapsed for section in sections)
        for section in sections:
            section.collapsed = not opening
