"""The chat database's schema: append-only named migrations, and the columns they make.

Each migration is a named SQL step applied once, in order, and recorded in `migrations`;
a new schema change is a new entry at the end of MIGRATIONS, never an edit of an old one.
The schema's version is the number of steps (also kept in `PRAGMA user_version`).
"""

from __future__ import annotations

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

EXPECTED_COLUMNS = {
    "conversations": ("id", "title", "created_at", "updated_at", "pair", "target", "draft"),
    "messages": (
        "id",
        "conversation_id",
        "role",
        "content",
        "complete",
        "token_count",
        "finish_reason",
        "stats_json",
        "pair",
        "target",
        "draft",
        "created_at",
        "updated_at",
        "reasoning",
        "sources_json",
    ),
}
"""The columns MIGRATIONS make, which the reads use."""


def schema_version(migrations: list[str]) -> int:
    """A schema's version: how many migration steps made it."""
    return len(migrations)
