"""`macspec history --export`: every conversation that can still be read, even from a damaged
database, as JSON.

The file is opened read-only (nothing is written to a damaged database). Each table is read
whole when it can be; when a damaged page stops that, row by row by id, so one bad page
loses only the rows on it. What could not be read is counted, never guessed.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from macspec.chat.faults import describe, is_damage, move_aside
from macspec.errors import MacspecError

PROBE_LIMIT = 1_000_000
"""Most ids probed one by one in a table whose highest id cannot be read."""


@dataclass
class Export:
    """What could be read."""

    conversations: list[dict[str, Any]] = field(default_factory=list)
    """`history show --json` records, oldest first."""
    unreadable: int = 0
    """Rows (conversations or messages) that exist but could not be read."""
    notes: list[str] = field(default_factory=list)
    """What stopped a whole-table read (one line each)."""
    uncounted: bool = False
    """Rows may be lost that `unreadable` does not count (a table's highest id unreadable)."""

    @property
    def message_count(self) -> int:
        return sum(len(c["messages"]) for c in self.conversations)


def export_readable(path: Path) -> Export:
    """Read every conversation and message that can be read from the database at `path`."""
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise describe(exc, path, 0) from None
    db.row_factory = sqlite3.Row
    export = Export()
    try:
        db.execute("SELECT name FROM sqlite_master").fetchall()
    except sqlite3.Error as exc:
        db.close()
        if not is_damage(exc):  # locked, unreadable: the file may be fine
            raise describe(exc, path, 0) from None
        # No table can be found: there is nothing to read row by row.
        raise MacspecError(
            f"{path}: nothing in it can be read ({exc}); move it aside "
            f"({move_aside(path)}) and macspec starts a new one"
        ) from None
    try:
        conversations = {
            row["id"]: row for row in _rows(db, "conversations", export) if _has_id(row)
        }
        messages: dict[int, list[dict[str, Any]]] = {}
        for row in _rows(db, "messages", export):
            record = _message_record(row)
            if record is None:
                export.unreadable += 1
                continue
            messages.setdefault(record.pop("conversation_id"), []).append(record)
    finally:
        db.close()
    for cid in sorted(set(conversations) | set(messages)):
        head = conversations.get(cid)
        export.conversations.append(
            {
                "id": cid,
                "title": _get(head, "title") or "(title unreadable)",
                "created_at": _get(head, "created_at"),
                "updated_at": _get(head, "updated_at"),
                "pair": _get(head, "pair"),
                "target": _get(head, "target"),
                "draft": _get(head, "draft"),
                "message_count": len(messages.get(cid, [])),
                "messages": sorted(messages.get(cid, []), key=lambda m: m["id"]),
            }
        )
    return export


def _rows(db: sqlite3.Connection, table: str, export: Export) -> Iterator[sqlite3.Row]:
    """The rows of `table`: all at once, or, past a damaged page, one id at a time."""
    try:
        yield from db.execute(f"SELECT * FROM {table} ORDER BY id").fetchall()
        return
    except sqlite3.DatabaseError as exc:
        export.notes.append(f"{table}: {exc}; reading row by row")
    highest = _highest_id(db, table)
    if highest is None:  # ids that fail may never have been used: not counted as rows lost
        export.notes.append(f"{table}: its highest id is unreadable; lost rows not counted")
        export.uncounted = True
    for row_id in range(1, (PROBE_LIMIT if highest is None else highest) + 1):
        try:
            row = db.execute(f"SELECT * FROM {table} WHERE id = ?", (row_id,)).fetchone()
        except sqlite3.DatabaseError:
            export.unreadable += highest is not None
            continue
        if row is not None:
            yield row


def _highest_id(db: sqlite3.Connection, table: str) -> int | None:
    """The highest id the table has used (AUTOINCREMENT keeps it apart), None if unreadable."""
    for sql in (
        "SELECT seq FROM sqlite_sequence WHERE name = ?",
        f"SELECT max(id) FROM {table} WHERE ? IS NOT NULL",
    ):
        try:
            row = db.execute(sql, (table,)).fetchone()
        except sqlite3.DatabaseError:
            continue
        if row is not None and row[0] is not None:
            return int(row[0])
    return None


def _has_id(row: sqlite3.Row) -> bool:
    try:
        return isinstance(row["id"], int)
    except IndexError:
        return False


def _get(row: sqlite3.Row | None, key: str) -> Any:
    if row is None:
        return None
    try:
        return row[key]
    except IndexError:
        return None


def _message_record(row: sqlite3.Row) -> dict[str, Any] | None:
    """A message as `history show --json` prints it (a column the file lacks is null), or
    None when the row cannot be made sense of."""
    try:
        record = {
            "id": int(row["id"]),
            "conversation_id": int(row["conversation_id"]),
            "role": row["role"],
            "content": row["content"],
        }
    except (IndexError, TypeError, ValueError):
        return None
    for key in ("reasoning", "complete", "token_count", "finish_reason"):
        record[key] = _get(row, key)
    record["complete"] = bool(record["complete"]) if record["complete"] is not None else None
    try:
        record["stats"] = json.loads(_get(row, "stats_json") or "null")
    except ValueError:
        record["stats"] = None
    for key in ("pair", "target", "draft", "created_at"):
        record[key] = _get(row, key)
    return record
