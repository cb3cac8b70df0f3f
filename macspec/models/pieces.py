"""The pieces a streamed answer is divided into (reasoning, text, tool calls), and the text
helpers every call parser shares: what to hold back at a tag's start, a call that did not parse.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from macspec.models.tools import ToolCall, ToolFormat

log = logging.getLogger("macspec.serve")


@dataclass(frozen=True)
class Reasoning:
    text: str


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class Call:
    call: ToolCall


Piece = Reasoning | Text | Call


def partial_suffix(text: str, tag: str) -> int:
    """Length of the longest end of `text` that is a proper start of `tag` (held back)."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:size]):
            return size
    return 0


def unparsed(fmt: ToolFormat, body: str, reason: str) -> list[Piece]:
    """A call that does not parse: its text, without the tags (also any inside it), and one
    log line."""
    log.warning("a %s tool call did not parse (%s); sent as text", fmt.name, reason)
    body = without_tags(fmt, body)
    return [Text(body)] if body else []


def without_tags(fmt: ToolFormat, body: str) -> str:
    """A call's text with the format's tags taken out, stripped."""
    for tag in (fmt.start, fmt.end):
        body = body.replace(tag, "") if tag else body
    return body.strip()
