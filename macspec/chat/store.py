"""Conversations in SQLite (stdlib sqlite3), in the macspec home, with append-only migrations.

The schema grows by append-only named migrations (schema.py), each applied once, in order,
and recorded in `migrations`. The store is used from the chat's generation thread and from
the UI thread: one connection, guarded by a lock, every write committed at once so a crash
loses nothing already written. Migrations run under the write lock (BEGIN IMMEDIATE); a
database from a newer macspec is refused unwritten; every sqlite3 failure becomes a
one-line StorageError (see faults.py).
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from macspec import __version__
from macspec.chat.faults import (
    DamagedDatabase,
    NewerSchema,
    describe,
    prepare_home,
)
from macspec.chat.records import (
    NO_MODELS,
    Conversation,
    ConversationSummary,
    MessageRow,
    ModelInfo,
    StoredMessage,
    answer_fields,
    message_from_row,
    summary_from_row,
    title_for,
)
from macspec.chat.schema import EXPECTED_COLUMNS, MIGRATIONS, schema_version
from macspec.errors import MacspecError
from macspec.models.home import check_home_is_a_folder, macspec_home

__all__ = [
    "BUSY_TIMEOUT_S",
    "Conversation",
    "ConversationSummary",
    "DATABASE_FILE",
    "MIGRATIONS",
    "MessageRow",
    "ModelInfo",
    "Store",
    "StoredMessage",
    "default_database_path",
    "title_for",
]

DATABASE_FILE = "chats.db"


def default_database_path() -> Path:
    """The chat database in the macspec home (MACSPEC_HOME moves it)."""
    return macspec_home() / DATABASE_FILE


def existing_database() -> Path | None:
    """The chat database for commands that only read it: None when none was made yet (and
    nothing is created); a home that is a file is one line, not an empty history."""
    database = default_database_path()
    check_home_is_a_folder(database.parent)
    return database if database.is_file() else None


BUSY_TIMEOUT_S = 10.0
"""How long a write waits for another process's lock before it gives up (and says so)."""


class Store:
    """The conversation database; safe to share between threads.

    Every failure of the database (locked past the busy timeout, read-only, a full disk, a
    damaged file) is raised as a StorageError naming the file and the problem in one line.
    """

    def __init__(self, path: Path | None = None, busy_timeout_s: float = BUSY_TIMEOUT_S):
        self.path = Path(path) if path is not None else default_database_path()
        self.busy_timeout_s = busy_timeout_s
        self._lock = threading.Lock()
        prepare_home(self.path)
        self._reopen = False
        """A write failed on a read-only file: reconnect before the next (it may be fixed)."""
        self._db = self._connect()
        try:
            self.migrate()
        except BaseException:
            self._db.close()
            raise

    def _connect(self) -> sqlite3.Connection:
        try:
            db = sqlite3.connect(
                str(self.path),
                check_same_thread=False,
                timeout=self.busy_timeout_s,
                isolation_level=None,
            )
        except sqlite3.Error as exc:
            raise describe(exc, self.path, self.busy_timeout_s) from None
        try:
            with self._guard():
                db.row_factory = sqlite3.Row
                db.execute("PRAGMA foreign_keys = ON")
                self._wal(db)
        except BaseException:
            db.close()
            raise
        return db

    def _writable(self) -> None:
        """Before a write (the lock held): a connection SQLite opened read-only stays so even
        once the file can be written again, so after a read-only failure, open a new one."""
        if self._reopen:
            fresh = self._connect()
            self._db.close()
            self._db, self._reopen = fresh, False

    def _wal(self, db: sqlite3.Connection) -> None:
        """WAL journal (readers never wait for the writer); a read-only file keeps its own.

        Switching a new file to WAL needs it to itself, and SQLite answers "locked" at once
        rather than wait when another process is opening it too: retried until the timeout.
        """
        deadline = time.monotonic() + self.busy_timeout_s
        while True:
            try:
                if db.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                    db.execute("PRAGMA journal_mode = WAL").fetchone()
                return
            except sqlite3.OperationalError as exc:
                if str(exc).startswith("attempt to write a readonly"):
                    return
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)

    # -- schema --------------------------------------------------------------------------
    def migrate(self) -> list[str]:
        """Apply the migrations not yet applied, in order, in one transaction; returns their
        names. A database from a newer macspec (steps this one does not know) is refused
        before anything is written to it.

        The applied list is read again under BEGIN IMMEDIATE (the write lock), so processes
        opening a fresh home at the same time apply each step exactly once.
        """
        known = [name for name, _ in MIGRATIONS]
        with self._lock, self._guard():
            done = self._applied()  # a read: an up-to-date or newer database gets no write
            self._check_version(done, known)
            if set(known) <= set(done):
                return []
            with self._transaction():
                self._db.execute(
                    "CREATE TABLE IF NOT EXISTS migrations "
                    "(name TEXT PRIMARY KEY, applied_at REAL NOT NULL)"
                )
                done = self._applied()
                self._check_version(done, known)
                applied = []
                for name, sql in MIGRATIONS:
                    if name in done:
                        continue
                    for statement in filter(str.strip, sql.split(";")):
                        self._db.execute(statement)
                    self._db.execute(
                        "INSERT INTO migrations (name, applied_at) VALUES (?, ?)",
                        (name, time.time()),
                    )
                    applied.append(name)
                # For other tools: `PRAGMA user_version` is the schema version too.
                self._db.execute(f"PRAGMA user_version = {schema_version(known)}")
            return applied

    def _applied(self) -> list[str]:
        """Names of the applied migrations, in order ([] for a new database)."""
        exists = self._db.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'migrations'"
        ).fetchone()
        if not exists:
            return []
        return [row[0] for row in self._db.execute("SELECT name FROM migrations ORDER BY rowid")]

    def _check_version(self, done: list[str], known: list[str]) -> None:
        unknown = [name for name in done if name not in known]
        if unknown:
            raise NewerSchema(
                f"{self.path} was written by a newer macspec: its schema is version "
                f"{schema_version(done)} (with {', '.join(unknown)}), and macspec "
                f"{__version__} knows version {schema_version(known)}; upgrade macspec, or set "
                "MACSPEC_HOME to another folder (nothing was written)"
            )

    def applied_migrations(self) -> list[str]:
        with self._lock, self._guard():
            return self._applied()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def _guard(self) -> Iterator[None]:
        """sqlite3 errors (and rows that lack a column macspec wrote) -> one-line StorageErrors."""
        try:
            yield
        except sqlite3.Error as exc:
            fault = describe(exc, self.path, self.busy_timeout_s)
            self._reopen = self._reopen or fault.read_only
            raise fault from None
        except IndexError:  # sqlite3.Row: a column renamed or dropped outside macspec
            raise DamagedDatabase(self.path, self._missing_columns()) from None
        except json.JSONDecodeError as exc:
            raise DamagedDatabase(self.path, f"a stored JSON field is unreadable: {exc}") from None

    def _missing_columns(self) -> str:
        """'no column messages.reasoning': what a hand-edited schema lacks (the lock is held)."""
        missing = []
        for table, columns in EXPECTED_COLUMNS.items():
            try:
                have = {row[1] for row in self._db.execute(f"PRAGMA table_info({table})")}
            except sqlite3.Error:
                have = set()
            missing += [f"{table}.{c}" for c in columns if c not in have]
        return f"no column {', '.join(missing) or '(unknown)'} as macspec wrote it"

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        """BEGIN IMMEDIATE ... COMMIT, or ROLLBACK on any error; the caller holds the lock.

        IMMEDIATE takes the write lock at once (waiting up to the busy timeout), so a
        transaction never fails halfway for a lock. SQLite may already have rolled back
        (a full disk does), so the ROLLBACK is best effort.
        """
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
            self._db.execute("COMMIT")
        except BaseException:
            if self._db.in_transaction:
                try:
                    self._db.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
            raise

    def _write(self, sql: str, params: tuple = ()) -> int:
        with self._lock, self._guard():  # autocommit: one statement is its own transaction
            self._writable()
            return self._db.execute(sql, params).lastrowid or 0

    # -- writes --------------------------------------------------------------------------
    def create_conversation(self, title: str, models: ModelInfo = NO_MODELS) -> int:
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
        models: ModelInfo = NO_MODELS,
    ) -> int:
        """Append a message; returns its id."""
        row = MessageRow(role, content, complete, models)
        _, (message_id,) = self.save(conversation_id, "", NO_MODELS, [row])
        return message_id

    def save(
        self,
        conversation_id: int | None,
        title: str,
        models: ModelInfo,
        new: list[MessageRow],
        changed: list[tuple[int, MessageRow]] = (),
    ) -> tuple[int, list[int]]:
        """In one transaction: create the conversation (when `conversation_id` is None, with
        `title` and `models`), append the `new` messages and rewrite the `changed` ones.
        All or nothing; returns (conversation id, ids of the new messages)."""
        now = time.time()
        with self._lock, self._guard():
            self._writable()
            with self._transaction():
                if conversation_id is None:
                    conversation_id = self._db.execute(
                        "INSERT INTO conversations (title, created_at, updated_at, pair, "
                        "target, draft) VALUES (?, ?, ?, ?, ?, ?)",
                        (title, now, now, models.pair, models.target, models.draft),
                    ).lastrowid
                ids = [self._insert(conversation_id, row, now) for row in new]
                for message_id, row in changed:
                    self._update(message_id, row, now)
                self._db.execute(
                    "UPDATE conversations SET updated_at = ? WHERE id = ?", (now, conversation_id)
                )
        return int(conversation_id), ids

    def _insert(self, conversation_id: int, row: MessageRow, now: float) -> int:
        return int(
            self._db.execute(
                "INSERT INTO messages (conversation_id, role, content, complete, token_count, "
                "finish_reason, stats_json, reasoning, sources_json, pair, target, draft, "
                "created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (conversation_id, row.role, *answer_fields(row), row.models.pair)
                + (row.models.target, row.models.draft, now, now),
            ).lastrowid
        )

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
        row = MessageRow(
            "assistant",
            content,
            complete,
            token_count=token_count,
            finish_reason=finish_reason,
            stats=stats,
            reasoning=reasoning,
            sources=sources,
        )
        with self._lock, self._guard():  # autocommit: one statement is its own transaction
            self._writable()
            self._update(message_id, row, time.time())

    def _update(self, message_id: int, row: MessageRow, now: float) -> None:
        self._db.execute(
            "UPDATE messages SET content = ?, complete = ?, token_count = ?, finish_reason = ?, "
            "stats_json = ?, reasoning = ?, sources_json = ?, updated_at = ? WHERE id = ?",
            (*answer_fields(row), now, message_id),
        )

    def delete_conversation(self, conversation_id: int) -> None:
        self.get(conversation_id)  # unknown id: the one-line error
        self._write("DELETE FROM conversations WHERE id = ?", (conversation_id,))

    # -- reads ---------------------------------------------------------------------------
    def list_conversations(self) -> list[ConversationSummary]:
        """All conversations, most recently changed first."""
        with self._lock, self._guard():
            rows = self._db.execute(
                "SELECT c.*, (SELECT COUNT(*) FROM messages m WHERE m.conversation_id = c.id) "
                "AS message_count FROM conversations c ORDER BY c.updated_at DESC, c.id DESC"
            ).fetchall()
            return [summary_from_row(row) for row in rows]

    def latest_conversation_id(self) -> int | None:
        """The most recently changed conversation (what `--continue` resumes)."""
        with self._lock, self._guard():
            row = self._db.execute(
                "SELECT id FROM conversations ORDER BY updated_at DESC, id DESC LIMIT 1"
            ).fetchone()
        return int(row[0]) if row else None

    def get(self, conversation_id: int) -> Conversation:
        """A conversation with its messages; an unknown id is a one-line error."""
        unknown = MacspecError(f"no conversation with id {conversation_id} (see `macspec history`)")
        if not 0 < conversation_id <= SQLITE_MAX_INTEGER:
            raise unknown  # SQLite could not even hold such an id
        with self._lock, self._guard():
            row = self._db.execute(
                "SELECT c.*, (SELECT COUNT(*) FROM messages m WHERE m.conversation_id = c.id) "
                "AS message_count FROM conversations c WHERE c.id = ?",
                (conversation_id,),
            ).fetchone()
            if row is None:
                raise unknown
            rows = self._db.execute(
                "SELECT * FROM messages WHERE conversation_id = ? ORDER BY id", (conversation_id,)
            ).fetchall()
            return Conversation(summary_from_row(row), [message_from_row(r) for r in rows])


SQLITE_MAX_INTEGER = 2**63 - 1
"""The largest id SQLite can store."""
