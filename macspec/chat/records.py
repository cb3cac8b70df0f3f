"""What the chat database holds, as values: models, messages, conversations, and the rows
they are read from and written as. No database access here (that is store.py)."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ModelInfo:
    """Which models a conversation or an answer came from, as the user named them."""

    target: str | None = None
    """The target model (repo id, folder or package spec)."""
    draft: str | None = None
    """The draft model; None for plain decoding."""
    pair: str | None = None
    """The catalog pair, or None when models were named directly."""

    @property
    def label(self) -> str:
        """A short name for the UI: the pair, else the target's last path part."""
        if self.pair:
            return self.pair
        target, draft = (_short(m) for m in (self.target, self.draft))
        return f"{target} + {draft}" if self.draft else target


NO_MODELS = ModelInfo()
"""No models named (a user message, or a conversation started before models were known)."""


def _short(model: str | None) -> str:
    """The last part of a repo id or folder: 'Qwen2.5-7B-Instruct-4bit'."""
    return (model or "?").rstrip("/").rsplit("/", 1)[-1]


@dataclass(frozen=True)
class StoredMessage:
    """One message as stored."""

    id: int
    """Row id."""
    role: str
    """'user' or 'assistant' (or 'system')."""
    content: str
    """The text; for an answer cut short, as far as it got."""
    complete: bool
    """False for an answer that was cancelled, crashed or is still being written."""
    token_count: int | None
    """Generated tokens of an answer; None for user messages."""
    finish_reason: str | None
    """The engine's finish reason, or 'error' / 'interrupted' when it never finished."""
    stats: dict[str, Any] | None
    """Stats.to_dict() of an answer (None until it has finished)."""
    models: ModelInfo
    """The models that wrote an answer."""
    created_at: float
    """Unix time the message was first saved."""
    reasoning: str | None = None
    """A thinking model's reasoning before the answer (not part of `content`)."""
    sources: list[list[str]] | None = None
    """The answer as runs of [text, 'draft' | 'target']: who wrote each part."""


@dataclass(frozen=True)
class ConversationSummary:
    """A row of the conversation list."""

    id: int
    """Conversation id (what `--resume` takes)."""
    title: str
    """The start of the first user message."""
    created_at: float
    """Unix time it was started."""
    updated_at: float
    """Unix time of its last change."""
    message_count: int
    """Messages in it, user and assistant."""
    models: ModelInfo
    """The models it was started with."""


@dataclass(frozen=True)
class Conversation:
    """A whole stored conversation."""

    summary: ConversationSummary
    """Its list row."""
    messages: list[StoredMessage]
    """Its messages, oldest first."""


def title_for(text: str, limit: int = 60) -> str:
    """A one-line title from the start of the first message."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


@dataclass
class MessageRow:
    """A message as it is written: what `add_message` and `update_answer` take, as one value."""

    role: str
    """'user' or 'assistant' (or 'system')."""
    content: str
    """The text as far as it got."""
    complete: bool = True
    """False for an answer cut short (or still streaming)."""
    models: ModelInfo = NO_MODELS
    """The models that wrote an answer."""
    token_count: int | None = None
    """Generated tokens of an answer."""
    finish_reason: str | None = None
    """The engine's finish reason, or 'error' / 'interrupted'."""
    stats: dict[str, Any] | None = None
    """Stats.to_dict() of a finished answer."""
    reasoning: str | None = None
    """A thinking model's reasoning, apart from the answer."""
    sources: list[list[str]] | None = None
    """Runs of [text, source] of the answer."""


def answer_fields(row: MessageRow) -> tuple:
    """content, complete, token_count, finish_reason, stats_json, reasoning, sources_json."""
    return (
        row.content,
        int(row.complete),
        row.token_count,
        row.finish_reason,
        json.dumps(row.stats) if row.stats is not None else None,
        row.reasoning,
        json.dumps(row.sources) if row.sources is not None else None,
    )


def models_from_row(row: sqlite3.Row) -> ModelInfo:
    return ModelInfo(target=row["target"], draft=row["draft"], pair=row["pair"])


def summary_from_row(row: sqlite3.Row) -> ConversationSummary:
    return ConversationSummary(
        id=int(row["id"]),
        title=row["title"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        message_count=int(row["message_count"]),
        models=models_from_row(row),
    )


def message_from_row(row: sqlite3.Row) -> StoredMessage:
    stats = json.loads(row["stats_json"]) if row["stats_json"] else None
    return StoredMessage(
        id=int(row["id"]),
        role=row["role"],
        content=row["content"],
        complete=bool(row["complete"]),
        token_count=row["token_count"],
        finish_reason=row["finish_reason"],
        stats=stats,
        models=models_from_row(row),
        created_at=row["created_at"],
        reasoning=row["reasoning"],
        sources=json.loads(row["sources_json"]) if row["sources_json"] else None,
    )
