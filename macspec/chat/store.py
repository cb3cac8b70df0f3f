"""Conversations in SQLite (stdlib sqlite3), in the macspec home, with append-only migrations.

Each migration is a named SQL step applied once, in order, and recorded in `migrations`;
a new schema change is a new entry at the end of MIGRATIONS, never an edit of an old one.
The store is used from the chat's generation thread and from the UI thread: one connection,
guarded by a lock, every write committed at once so a crash loses nothing already written.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from macspec.errors import MacspecError
from macspec.models.home import macspec_home

DATABASE_FILE = "chats.db"

MIGRATIONS: list[tuple[str, str]] = [
    (
        "0001_conversations",
        """
        CREATE TABLE conversations (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            title TEXT NOT NULL,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            pair TEXT,
            target TEXT,
            draft TEXT
        );
        """,
    ),
    (
        "0002_messages",
        """
        CREATE TABLE messages (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
            role TEXT NOT NULL,
            content TEXT NOT NULL,
            complete INTEGER NOT NULL DEFAULT 1,
            token_count INTEGER,
            finish_reason TEXT,
            stats_json TEXT,
            pair TEXT,
            target TEXT,
            draft TEXT,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL
        );
        CREATE INDEX messages_by_conversation ON messages(conversation_id, id);
        """,
    ),
    (
        "0003_reasoning_and_sources",
        """
        ALTER TABLE messages ADD COLUMN reasoning TEXT;
        ALTER TABLE messages ADD COLUMN sources_json TEXT;
        """,
    ),
]


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


def default_database_path() -> Path:
    """The chat database in the macspec home (MACSPEC_HOME moves it)."""
    return macspec_home() / DATABASE_FILE


def title_for(text: str, limit: int = 60) -> str:
    """A one-line title from the start of the first message."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


class Store:
    """The conversation database; safe to share between threads."""

    def __init__(self, path: Path | None = None):
        self.path = Path(path) if path is not None else default_database_path()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(
                str(self.path), check_same_thread=False, timeout=10, isolation_level=None
            )
            self._db.row_factory = sqlite3.Row
            self._db.execute("PRAGMA foreign_keys = ON")
            self._db.execute("PRAGMA journal_mode = WAL")
        except (OSError, sqlite3.Error) as exc:
            raise MacspecError(f"{self.path}: cannot open the chat database: {exc}") from None
        self._lock = threading.Lock()
        self.migrate()

    # -- schema --------------------------------------------------------------------------
    def migrate(self) -> list[str]:
        """Apply the migrations not yet applied, in order; returns their names."""
        with self._lock:
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS migrations "
                "(name TEXT PRIMARY KEY, applied_at REAL NOT NULL)"
            )
            done = {row[0] for row in self._db.execute("SELECT name FROM migrations")}
            applied = []
            for name, sql in MIGRATIONS:
                if name in done:
                    continue
                # One transaction per step: a failure leaves the step unapplied and unrecorded.
                with self._transaction():
                    for statement in filter(str.strip, sql.split(";")):
                        self._db.execute(statement)
                    self._db.execute(
                        "INSERT INTO migrations (name, applied_at) VALUES (?, ?)",
                        (name, time.time()),
                    )
                applied.append(name)
            return applied

    def applied_migrations(self) -> list[str]:
        with self._lock:
            rows = self._db.execute("SELECT name FROM migrations ORDER BY rowid").fetchall()
        return [row[0] for row in rows]

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        """BEGIN ... COMMIT, or ROLLBACK on any error; the caller holds the lock."""
        self._db.execute("BEGIN")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _write(self, sql: str, params: tuple = ()) -> int:
        with self._lock:  # autocommit: one statement is its own transaction
            return self._db.execute(sql, params).lastrowid or 0

    # -- writes --------------------------------------------------------------------------
    def create_conversation(self, title: str, models: ModelInfo = ModelInfo()) -> int:
        now = time.time()
        return self._write(
            "INSERT INTO conversations (title, created_at, updated_at, pair, target, draft) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (title, now, now, models.pair, models.target, models.draft),
        )

    def add_message(
        self,
        conversation_id: int,
        role: str,
        content: str,
        complete: bool = True,
        models: ModelInfo = ModelInfo(),
    ) -> int:
        """Append a message; returns its id."""
        now = time.time()
        with self._lock, self._transaction():
            row = self._db.execute(
                "INSERT INTO messages (conversation_id, role, content, complete, pair, target, "
                "draft, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    conversation_id,
                    role,
                    content,
                    int(complete),
                    models.pair,
                    models.target,
                    models.draft,
                    now,
                    now,
                ),
            ).lastrowid
            self._db.execute(
                "UPDATE conversations SET updated_at = ? WHERE id = ?", (now, conversation_id)
            )
        return int(row)

    def update_answer(
        self,
        message_id: int,
        content: str,
        complete: bool,
        token_count: int | None = None,
        finish_reason: str | None = None,
        stats: dict[str, Any] | None = None,
        reasoning: str | None = None,
        sources: list[list[str]] | None = None,
    ) -> None:
        """Rewrite an answer as far as it has got (called while streaming and at its end)."""
        self._write(
            "UPDATE messages SET content = ?, complete = ?, token_count = ?, finish_reason = ?, "
            "stats_json = ?, reasoning = ?, sources_json = ?, updated_at = ? WHERE id = ?",
            (
                content,
                int(complete),
                token_count,
                finish_reason,
                json.dumps(stats) if stats is not None else None,
                reasoning,
                json.dumps(sources) if sources is not None else None,
                time.time(),
                message_id,
            ),
        )

    def delete_conversation(self, conversation_id: int) -> None:
        self.get(conversation_id)  # unknown id: the one-line error
        self._write("DELETE FROM conversations WHERE id = ?", (conversation_id,))

    # -- reads ---------------------------------------------------------------------------
    def list_conversations(self) -> list[ConversationSummary]:
        """All conversations, most recently changed first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT c.*, (SELECT COUNT(*) FROM messages m WHERE m.conversation_id = c.id) "
                "AS message_count FROM conversations c ORDER BY c.updated_at DESC, c.id DESC"
            ).fetchall()
        return [_summary(row) for row in rows]

    def latest_conversation_id(self) -> int | None:
        """The most recently changed conversation (what `--continue` resumes)."""
        with self._lock:
            row = self._db.execute(
                "SELECT id FROM conversations ORDER BY updated_at DESC, id DESC LIMIT 1"
            ).fetchone()
        return int(row[0]) if row else None

    def get(self, conversation_id: int) -> Conversation:
        """A conversation with its messages; an unknown id is a one-line error."""
        with self._lock:
            row = self._db.execute(
                "SELECT c.*, (SELECT COUNT(*) FROM messages m WHERE m.conversation_id = c.id) "
                "AS message_count FROM conversations c WHERE c.id = ?",
                (conversation_id,),
            ).fetchone()
            if row is None:
                raise MacspecError(
                    f"no conversation with id {conversation_id} (see `macspec history`)"
                )
            rows = self._db.execute(
                "SELECT * FROM messages WHERE conversation_id = ? ORDER BY id", (conversation_id,)
            ).fetchall()
        return Conversation(_summary(row), [_message(r) for r in rows])


def _models(row: sqlite3.Row) -> ModelInfo:
    return ModelInfo(target=row["target"], draft=row["draft"], pair=row["pair"])


def _summary(row: sqlite3.Row) -> ConversationSummary:
    return ConversationSummary(
        id=int(row["id"]),
        title=row["title"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        message_count=int(row["message_count"]),
        models=_models(row),
    )


def _message(row: sqlite3.Row) -> StoredMessage:
    stats = json.loads(row["stats_json"]) if row["stats_json"] else None
    return StoredMessage(
        id=int(row["id"]),
        role=row["role"],
        content=row["content"],
        complete=bool(row["complete"]),
        token_count=row["token_count"],
        finish_reason=row["finish_reason"],
        stats=stats,
        models=_models(row),
        created_at=row["created_at"],
        reasoning=row["reasoning"],
        sources=json.loads(row["sources_json"]) if row["sources_json"] else None,
    )
