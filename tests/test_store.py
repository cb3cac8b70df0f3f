"""The conversation store: migrations, messages, answers rewritten as they stream."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from macspec.chat import store as store_module
from macspec.chat.faults import StorageError
from macspec.chat.store import ModelInfo, Store, default_database_path, title_for
from macspec.errors import MacspecError


def test_database_lives_in_the_macspec_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("MACSPEC_HOME", str(tmp_path / "home"))
    store = Store()
    assert store.path == default_database_path() == tmp_path / "home" / "chats.db"
    assert store.path.is_file()


def test_migrations_apply_once_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    path = tmp_path / "chats.db"
    names = [name for name, _ in store_module.MIGRATIONS]
    assert Store(path).applied_migrations() == names
    assert Store(path).migrate() == []  # reopening applies nothing again

    # A new migration appended later is applied to an existing database, after the others.
    extra = ("9999_tags", "CREATE TABLE tags (name TEXT PRIMARY KEY)")
    monkeypatch.setattr(store_module, "MIGRATIONS", [*store_module.MIGRATIONS, extra])
    reopened = Store(path)
    assert reopened.applied_migrations() == [*names, "9999_tags"]
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT COUNT(*) FROM tags").fetchone() == (0,)


def test_a_failing_migration_leaves_no_trace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    path = tmp_path / "chats.db"
    Store(path)
    broken = ("9999_broken", "CREATE TABLE half (x INTEGER); CREATE TABLE half (x INTEGER)")
    monkeypatch.setattr(store_module, "MIGRATIONS", [*store_module.MIGRATIONS, broken])
    with pytest.raises(StorageError, match="table half already exists"):
        Store(path)
    with sqlite3.connect(path) as db:
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master")}
        applied = {row[0] for row in db.execute("SELECT name FROM migrations")}
    assert "half" not in tables and "9999_broken" not in applied


def test_messages_and_answers_round_trip(tmp_path: Path):
    store = Store(tmp_path / "chats.db")
    models = ModelInfo(target="org/big", draft="org/small", pair="big")
    cid = store.create_conversation("hello", models)
    store.add_message(cid, "user", "hello there")
    answer = store.add_message(cid, "assistant", "", complete=False, models=models)
    store.update_answer(answer, "hi", complete=False, token_count=1)
    stats = {"generated_tokens": 2, "acceptance_rate": 0.5}
    store.update_answer(answer, "hi!", True, token_count=2, finish_reason="stop", stats=stats)

    conversation = store.get(cid)
    assert conversation.summary.title == "hello"
    assert conversation.summary.message_count == 2
    assert conversation.summary.models == models
    user, reply = conversation.messages
    assert (user.role, user.content, user.complete, user.token_count) == (
        "user",
        "hello there",
        True,
        None,
    )
    assert (reply.role, reply.content, reply.complete) == ("assistant", "hi!", True)
    assert (reply.token_count, reply.finish_reason, reply.stats) == (2, "stop", stats)
    assert reply.models == models


def test_list_latest_and_unknown_ids(tmp_path: Path):
    store = Store(tmp_path / "chats.db")
    assert store.list_conversations() == [] and store.latest_conversation_id() is None
    first = store.create_conversation("first")
    second = store.create_conversation("second")
    store.add_message(first, "user", "more")  # touching a conversation makes it the latest
    assert store.latest_conversation_id() == first
    assert [c.id for c in store.list_conversations()] == [first, second]
    with pytest.raises(MacspecError, match="no conversation with id 99"):
        store.get(99)
    store.delete_conversation(second)
    assert [c.id for c in store.list_conversations()] == [first]


def test_shared_between_threads(tmp_path: Path):
    store = Store(tmp_path / "chats.db")
    cid = store.create_conversation("threads")

    def write(n: int) -> None:
        for i in range(20):
            store.add_message(cid, "user", f"{n}-{i}")

    threads = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert store.get(cid).summary.message_count == 80


def test_unwritable_home_is_one_line(tmp_path: Path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(MacspecError, match="the macspec home is a file, not a folder"):
        Store(blocker / "chats.db")


def test_title_is_one_short_line():
    assert title_for("  hello\n  world ") == "hello world"
    assert len(title_for("x" * 200)) == 60
