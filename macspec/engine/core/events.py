"""What the engine yields. Renderers (CLI, TUI, bench) only ever see these."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from macspec.engine.core.cycle import Cycle
from macspec.engine.core.stats import Stats

__all__ = ["Cycle", "Done", "Event", "Prefill", "Source", "Token"]


class Source(str, Enum):
    """Who produced a token."""

    DRAFT = "draft"
    """A drafted guess the target accepted."""
    TARGET = "target"
    """The target's own token: a correction, a bonus token, or plain decoding."""


@dataclass(frozen=True)
class Prefill:
    """How much of the prompt the caches already held: the first event, before the prompt is
    prefilled (a server reports it before the answer, e.g. Anthropic's `message_start`)."""

    prompt_tokens: int
    """Ids in the prompt."""
    cached_tokens: int
    """Of those, ids the caches held already: only the rest is prefilled."""


@dataclass(frozen=True)
class Token:
    """One generated token."""

    id: int
    """The token id."""
    text: str
    """Text released with this token; may be empty while bytes of a character or a
    possible stop string are held back."""
    source: Source
    """Whether an accepted draft guess or the target produced it."""


@dataclass(frozen=True)
class Done:
    """The end of a generation. Always the last event, also after a stop or cancel."""

    finish_reason: str
    """'stop' (EOS), 'stop_string', 'length' (max tokens), 'context' (the context window is
    full) or 'cancelled'."""
    text: str
    """The whole answer as it should be shown (stop string excluded)."""
    tail: str
    """Text released only now (held back for a possible stop string); renderers print it."""
    tokens: list[int]
    """Generated ids, EOS excluded."""
    sources: list[Source]
    """Source of each id in tokens."""
    stats: Stats
    """Counters and derived figures for the whole generation."""
    stop_string: str | None = None
    """The stop string that ended the answer ('stop_string'), else None."""


Event = Prefill | Token | Cycle | Done
