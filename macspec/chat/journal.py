"""Which messages of a chat are stored, and the saving of those that are not.

Storage can fail at any write: a database locked by another process past the busy
timeout, a read-only file, a full disk. A failed write loses nothing: the message stays in
memory as a Record not yet stored (or stored but behind), the chat goes on, and the next
save (the next turn, a retry, quitting) writes everything still unsaved in one transaction,
so each message is stored exactly once. What still cannot be saved when the chat ends is
written to a file in a temp folder (`rescue`), and the user is told exactly what it holds.
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from macspec.chat.faults import StorageError
from macspec.chat.records import MessageRow, ModelInfo, title_for
from macspec.chat.store import Store


@dataclass
class Record:
    """One message of the conversation: the session's dict and what is written for it."""

    message: dict[str, str]
    """{'role', 'content'}: what the prompt and the UI use (content kept current)."""
    row: MessageRow
    """What the database row holds (or should hold)."""
    id: int | None = None
    """The row id once stored; None while it is not."""
    behind: bool = False
    """Stored, but the stored copy is older than `row` (a rewrite failed)."""

    @property
    def saved(self) -> bool:
        return self.id is not None and not self.behind

    def sync(self) -> None:
        """The row's content from the message (streaming answers change it)."""
        self.row.content = self.message["content"]


@dataclass
class Chat:
    """One conversation's records, oldest first."""

    conversation_id: int | None
    """Its id once stored."""
    models: ModelInfo
    """The models it was started with (stored with it)."""
    records: list[Record] = field(default_factory=list)

    @property
    def title(self) -> str:
        first = next((r.message["content"] for r in self.records if r.row.role == "user"), "")
        return title_for(first)

    @property
    def unsaved(self) -> list[Record]:
        return [r for r in self.records if not r.saved]


class Journal:
    """The current chat and earlier ones with unsaved messages; saves them when it can."""

    def __init__(self, store: Store, models: ModelInfo):
        self.store = store
        self.current = Chat(None, models)
        self.stranded: list[Chat] = []
        """Earlier conversations (a new chat was started) with messages still unsaved."""
        self.problem: StorageError | None = None
        """Why the latest save failed; None once everything is saved."""
        self._lock = threading.RLock()  # a retry (UI) and a turn (worker) never save twice

    def switch(self, chat: Chat) -> None:
        """Make `chat` current; the current one is kept while it has unsaved messages."""
        if self.current.unsaved:
            self.stranded.append(self.current)
        self.current = chat

    @property
    def unsaved(self) -> list[tuple[Chat, Record]]:
        """Every message not (fully) stored, with its conversation."""
        return [(c, r) for c in [*self.stranded, self.current] for r in c.unsaved]

    def flush(self) -> StorageError | None:
        """Store everything unsaved (each conversation in one transaction); None when all is
        saved, else the problem (also kept in `problem`)."""
        with self._lock:
            return self._flush()

    def _flush(self) -> StorageError | None:
        for chat in [*self.stranded, self.current]:
            if chat.unsaved:
                try:
                    self._save(chat)
                except StorageError as exc:
                    self.problem = exc
                    return exc
        self.stranded = [c for c in self.stranded if c.unsaved]
        self.problem = None
        return None

    def _save(self, chat: Chat) -> None:
        for record in chat.records:
            record.sync()
        new = [r for r in chat.records if r.id is None]
        behind = [r for r in chat.records if r.id is not None and r.behind]
        conversation_id, ids = self.store.save(
            chat.conversation_id,
            chat.title,
            chat.models,
            [r.row for r in new],
            [(r.id, r.row) for r in behind],  # type: ignore[misc]
        )
        # Only now, committed: a failed transaction left every record as it was.
        chat.conversation_id = conversation_id
        for record, row_id in zip(new, ids):
            record.id = row_id
        for record in behind:
            record.behind = False

    def rewrite(self, record: Record) -> StorageError | None:
        """Write a stored record's new state (an answer as it streams or ends); one that is
        not stored yet waits for the next flush. A failure marks it behind."""
        with self._lock:
            return self._rewrite(record)

    def _rewrite(self, record: Record) -> StorageError | None:
        record.sync()
        if record.id is None:
            return self.problem
        try:
            self.store.update_answer(
                record.id,
                record.row.content,
                record.row.complete,
                token_count=record.row.token_count,
                finish_reason=record.row.finish_reason,
                stats=record.row.stats,
                reasoning=record.row.reasoning,
                sources=record.row.sources,
            )
        except StorageError as exc:
            record.behind, self.problem = True, exc
            return exc
        record.behind = False
        return None


# -- what could not be saved, when the chat ends ------------------------------------------


def describe_unsaved(unsaved: list[tuple[Chat, Record]]) -> list[str]:
    """One line per message not saved: 'conversation 3: your message "hello" (not stored)'."""
    lines = []
    for chat, record in unsaved:
        where = (
            f"conversation {chat.conversation_id}"
            if chat.conversation_id is not None
            else f'a new conversation "{chat.title}"'
        )
        row = record.row
        text = " ".join(row.content.split())
        quoted = f'"{text[:40]}…"' if len(text) > 40 else f'"{text}"'
        if row.role == "user":
            what = f"your message {quoted}"
        else:
            tokens = f"{row.token_count or 0} tokens, {row.finish_reason or 'unfinished'}"
            what = f"the answer {quoted} ({tokens})"
        state = "its latest text" if record.id is not None else "all of it"
        lines.append(f"{where}: {what}: {state}")
    return lines


def rescue(unsaved: list[tuple[Chat, Record]], database: Path, problem: str) -> Path:
    """Write the unsaved messages to a new file in a temp folder; returns its path.

    Raises OSError when even that fails (the caller then prints them).
    """
    folder = Path(tempfile.mkdtemp(prefix="macspec-unsaved-"))
    path = folder / "unsaved.json"
    path.write_text(json.dumps(rescue_record(unsaved, database, problem), indent=2) + "\n")
    return path


def rescue_record(
    unsaved: list[tuple[Chat, Record]], database: Path, problem: str
) -> dict[str, Any]:
    """The unsaved messages as JSON: by conversation, each with its stored id (or null)."""
    by_chat: dict[int, dict[str, Any]] = {}
    for chat, record in unsaved:
        entry = by_chat.setdefault(
            id(chat),
            {"conversation_id": chat.conversation_id, "title": chat.title, "messages": []},
        )
        row = asdict(record.row)
        row["models"] = asdict(record.row.models)
        entry["messages"].append({"message_id": record.id, **row})
    return {
        "database": str(database),
        "problem": problem,
        "written_at": time.time(),
        "conversations": list(by_chat.values()),
    }
