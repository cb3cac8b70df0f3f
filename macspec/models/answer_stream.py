"""A streamed answer divided into what clients show apart: reasoning, text and tool calls.

Text arrives in deltas whose boundaries fall anywhere, also inside a tag. Text that may be the
start of a tag is held back until it is clear, so no tag text ever reaches the content. A call
is handed on whole once it has been parsed (at its end tag, or at the end of the answer): one
that does not parse comes back as text, without its tags, with one log line, never an error.

`AnswerStream` picks the pieces for a model: `ReasoningSplitter` for `<think>` blocks, then
`TaggedCalls` for formats with start/end tags (mlx-lm's parsers), `LeadingJsonCalls` for
Llama 3's bare JSON, or `HarmonyStream` (harmony.py) for gpt-oss's channels.
"""

from __future__ import annotations

from macspec.models.harmony import HarmonyStream
from macspec.models.pieces import (
    Call,
    Piece,
    Reasoning,
    Text,
    partial_suffix,
    unparsed,
    without_tags,
)
from macspec.models.reasoning import ReasoningSplitter
from macspec.models.tools import HARMONY, ToolCall, ToolFormat


class TaggedCalls:
    """Calls between a start and an end tag (Qwen3, Qwen3.5, Gemma 4, GLM, Kimi, Mistral...),
    several per answer, text around them. Whitespace next to a call is not content."""

    def __init__(self, fmt: ToolFormat, tools: list[dict] | None = None, as_text: bool = False):
        self.fmt = fmt
        self.tools = tools
        self.as_text = as_text
        """Calls come back as their text, tags dropped (tool_choice 'none': none are wanted)."""
        self.inside = False
        self.held = ""
        """Text kept back: a possible start of the start tag, or whitespace next to a call."""
        self.body = ""
        """The current call's text so far (inside)."""
        self.calls_made = 0
        self.after_call = False
        """Whether the last thing handed on was a call (whitespace after it is dropped)."""

    def feed(self, text: str) -> list[Piece]:
        out: list[Piece] = []
        start, end = self.fmt.start, self.fmt.end
        while text:
            if not self.inside:
                text, self.held = self.held + text, ""
                at = text.find(start)
                if at >= 0:
                    before = text[:at].strip() if self.after_call else text[:at].rstrip()
                    if before:  # whitespace next to a call is not content
                        out.append(Text(before))
                    self.inside, self.body, text = True, "", text[at + len(start) :]
                    continue
                tag = partial_suffix(text, start)
                rest = text[: len(text) - tag]
                keep = tag + len(rest) - len(rest.rstrip())  # and the whitespace before it
                shown = text[: len(text) - keep]
                if self.after_call:
                    shown = shown.lstrip()  # whitespace right after a call is not content
                if shown:
                    out.append(Text(shown))
                    self.after_call = False
                self.held, text = text[len(text) - keep :], ""
            else:
                searched = max(0, len(self.body) - len(end))
                self.body += text
                text = ""
                at = self.body.find(end, searched) if end else -1
                if at >= 0:
                    text = self.body[at + len(end) :]
                    out.extend(self._close(self.body[:at]))
        return out

    def _close(self, body: str) -> list[Piece]:
        self.inside, self.body = False, ""
        if self.as_text:
            self.after_call = False
            text = without_tags(self.fmt, body)
            return [Text(text)] if text else []
        try:
            calls = self.fmt.parse(body, self.tools)
        except ValueError as exc:
            # A start tag inside a call that does not parse: the call was cut off there and a
            # new one began (a forced opening the model did not go on from). One whose
            # arguments merely hold the tag's text parses whole, above, and stays one call.
            again = body.rfind(self.fmt.start)
            if again >= 0:
                try:
                    calls = self.fmt.parse(body[again + len(self.fmt.start) :], self.tools)
                except ValueError:
                    pass
                else:
                    head = unparsed(self.fmt, body[:again].strip(), str(exc))
                    self.calls_made += len(calls)
                    self.after_call = True
                    return [*head, *(Call(c) for c in calls)]
            self.after_call = False
            return unparsed(self.fmt, body.strip(), str(exc))
        self.calls_made += len(calls)
        self.after_call = True
        return [Call(c) for c in calls]

    def finish(self) -> list[Piece]:
        """At the end of the answer: a call cut short (by max tokens, a stop, or a format whose
        calls end with the answer) is parsed as it is; held text is released."""
        if self.inside:
            return self._close(self.body)
        held, self.held = self.held, ""
        if self.calls_made or not held:
            return [] if not held.strip() else [Text(held.strip())]
        return [Text(held)]


class LeadingJsonCalls:
    """Llama 3.1/3.3: an answer that is a call is nothing but JSON (after `<|python_tag|>`),
    so an answer starting with '{' is held until its end and parsed whole; others stream."""

    MARKERS = ("{", "<|python_tag|>")

    def __init__(self, fmt: ToolFormat, tools: list[dict] | None = None):
        self.fmt = fmt
        self.tools = tools
        self.mode = "undecided"
        self.held = ""

    def feed(self, text: str) -> list[Piece]:
        if self.mode == "text":
            return [Text(text)] if text else []
        self.held += text
        if self.mode == "undecided":
            lead = self.held.lstrip()
            if not lead or any(m.startswith(lead) for m in self.MARKERS):
                return []
            if any(lead.startswith(m) for m in self.MARKERS):
                self.mode = "call"
                return []
            self.mode, held, self.held = "text", self.held, ""
            return [Text(held)]
        return []

    def finish(self) -> list[Piece]:
        held, self.held = self.held, ""
        if self.mode != "call":
            return [Text(held)] if held else []
        try:
            return [Call(c) for c in self.fmt.parse(held, self.tools)]
        except ValueError:
            return [Text(held)]  # a JSON answer, not a call: nothing to log


class AnswerStream:
    """One answer's text -> Reasoning, Text and Call pieces, for every protocol alike.

    `reasoning_start`: as `models.reasoning.reasoning_start` says for the prompt (None: no
    think tags). `fmt` and `tools`: the model's tool-call format and the request's tools; calls
    are parsed only with both. `forced`: text the prompt already ends with to open a call
    (`ToolFormat.opening`): the answer continues it. `calls_as_text` (with `fmt`, no tools):
    calls the model makes anyway come back as text, their tags dropped.
    """

    def __init__(
        self,
        reasoning_start: bool | None = None,
        fmt: ToolFormat | None = None,
        tools: list[dict] | None = None,
        forced: str = "",
        calls_as_text: bool = False,
    ):
        self.harmony = None
        self.splitter = None
        self.calls_parser: TaggedCalls | LeadingJsonCalls | None = None
        if fmt is HARMONY:
            self.harmony = HarmonyStream(tools if tools else None)
        else:
            if reasoning_start is not None:
                self.splitter = ReasoningSplitter(reasoning_start and not forced)
            if fmt is not None and tools:
                kind = LeadingJsonCalls if not fmt.start else TaggedCalls
                self.calls_parser = kind(fmt, tools)
            elif fmt is not None and fmt.start and calls_as_text:
                self.calls_parser = TaggedCalls(fmt, None, as_text=True)
        self.reasoning = ""
        self.text = ""
        self.calls: list[ToolCall] = []
        self.pieces: list[Piece] = []
        """Every piece handed on so far, in order."""
        self.reasoning_tokens = 0
        """Deltas (tokens, when fed one per token) that added to the reasoning."""
        if forced:
            self._route(forced, keep=False)

    def feed(self, delta: str) -> list[Piece]:
        pieces = self._route(delta)
        if any(isinstance(p, Reasoning) for p in pieces):
            self.reasoning_tokens += 1
        return pieces

    def finish(self) -> list[Piece]:
        """At the end of the answer: whatever was held back."""
        if self.harmony is not None:
            return self._note(self.harmony.finish())
        out: list[Piece] = []
        if self.splitter is not None:
            split = self.splitter.flush()
            if split.reasoning:
                out.append(Reasoning(split.reasoning))
            out.extend(self._answer(split.answer))
        if self.calls_parser is not None:
            out.extend(self.calls_parser.finish())
        return self._note(out)

    def _route(self, delta: str, keep: bool = True) -> list[Piece]:
        if self.harmony is not None:
            out = self.harmony.feed(delta)
        elif self.splitter is None:
            out = self._answer(delta)
        else:
            split = self.splitter.feed(delta)
            out = [Reasoning(split.reasoning)] if split.reasoning else []
            out.extend(self._answer(split.answer))
        return self._note(out) if keep else []

    def _answer(self, text: str) -> list[Piece]:
        if not text:
            return []
        if self.calls_parser is None:
            return [Text(text)]
        return self.calls_parser.feed(text)

    def _note(self, pieces: list[Piece]) -> list[Piece]:
        pieces = [p for p in pieces if not isinstance(p, (Reasoning, Text)) or p.text]
        self.pieces += pieces
        for piece in pieces:
            if isinstance(piece, Reasoning):
                self.reasoning += piece.text
            elif isinstance(piece, Text):
                self.text += piece.text
            else:
                self.calls.append(piece.call)
        return pieces
