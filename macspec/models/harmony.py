"""gpt-oss's harmony format, followed as it streams: the `analysis` channel is reasoning,
`final` (and `commentary` addressed to nobody) is the answer, and a `commentary` message
addressed `to=functions.NAME` is a tool call whose message is its JSON arguments.

The answer starts after the prompt's `<|start|>assistant`, so it opens with a header:

    <|channel|>analysis<|message|>...<|end|><|start|>assistant<|channel|>commentary
    to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>

(`to=` may also come before `<|channel|>`). `<|call|>` and `<|return|>` end the generation
(they are gpt-oss's end-of-sequence ids), so a message may just run to the end of the text.
mlx-lm has no parser for it.
"""

from __future__ import annotations

import json
import re

from macspec.models.pieces import Call, Piece, Reasoning, Text, partial_suffix, unparsed
from macspec.models.tools import HARMONY, ToolCall, new_call_id

MESSAGE, END, START = "<|message|>", "<|end|>", "<|start|>"
ENDINGS = (END, "<|call|>", "<|return|>")
CHANNEL = re.compile(r"<\|channel\|>\s*([A-Za-z_]+)")
RECIPIENT = re.compile(r"to=([^\s<]+)")
MAX_HEADER = 512
"""A header this long without `<|message|>` is not one: its text is shown as the answer."""


class HarmonyStream:
    """Harmony text -> Reasoning, Text and Call pieces (tool calls only with `tools`)."""

    def __init__(self, tools: list[dict] | None = None):
        self.tools = tools
        self.state = "header"
        self.buffer = ""
        """The header so far (state 'header'), or text held back in a message."""
        self.channel: str | None = None
        self.recipient: str | None = None
        self.arguments = ""
        """A call's message so far."""

    def feed(self, text: str) -> list[Piece]:
        out: list[Piece] = []
        text = self.buffer + text
        self.buffer = ""
        while text:
            if self.state == "header":
                at = text.find(MESSAGE)
                if at < 0:
                    if len(text) > MAX_HEADER:  # no header after all: plain answer text
                        self.state, self.channel, self.recipient = "message", "final", None
                        continue
                    self.buffer = text
                    break
                self._open(text[:at])
                text = text[at + len(MESSAGE) :]
            elif self.state == "message":
                ends = [(text.find(e), e) for e in ENDINGS if e in text]
                if ends:
                    at, ending = min(ends)
                    out.extend(self._content(text[:at]))
                    out.extend(self._close())
                    text = text[at + len(ending) :]
                    continue
                keep = max(partial_suffix(text, e) for e in ENDINGS)
                out.extend(self._content(text[: len(text) - keep]))
                self.buffer = text[len(text) - keep :]
                break
            else:  # between messages: skip to the next header
                at = text.find(START)
                if at < 0:
                    self.buffer = text[-len(START) :] if partial_suffix(text, START) else ""
                    break
                self.state, text = "header", text[at + len(START) :]
        return out

    def finish(self) -> list[Piece]:
        """The end of the answer (`<|call|>` or `<|return|>` ended it): close what is open."""
        held, self.buffer = self.buffer, ""
        if self.state == "header":
            plain = re.sub(r"<\|[a-z]+\|>", "", held).strip()
            return [Text(plain)] if plain and not CHANNEL.search(held) else []
        if self.state == "message":
            return [*self._content(held), *self._close()]
        return []

    def _open(self, header: str) -> None:
        channel = CHANNEL.search(header)
        recipient = RECIPIENT.search(header)
        self.channel = channel.group(1) if channel else "final"
        self.recipient = recipient.group(1) if recipient else None
        self.state, self.arguments = "message", ""

    def _is_call(self) -> bool:
        return bool(self.tools) and (self.recipient or "").startswith("functions.")

    def _content(self, text: str) -> list[Piece]:
        if not text:
            return []
        if self._is_call():
            self.arguments += text
            return []
        if self.channel == "analysis":
            return [Reasoning(text)]
        return [Text(text)]

    def _close(self) -> list[Piece]:
        self.state = "between"
        if not self._is_call():
            return []
        name = self.recipient.removeprefix("functions.")
        raw, self.arguments = self.arguments.strip(), ""
        try:
            arguments = json.loads(raw) if raw else {}
        except ValueError:
            arguments = None
        if not isinstance(arguments, dict):
            return unparsed(HARMONY, raw, "the arguments are not a JSON object")
        return [Call(ToolCall(name, arguments, new_call_id()))]
