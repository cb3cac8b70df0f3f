"""The chat database under faults: a lock held by another process, a read-only file or home,
a full disk, processes opening fresh homes at once, a newer schema, a damaged page, ids
SQLite cannot hold. Each is one line naming the file and the problem, never a traceback."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import random
import shlex
import sqlite3
from pathlib import Path

import pytest
from faultkit import damage_page_of, locked, read_only

from macspec.chat.faults import DamagedDatabase, StorageError
from macspec.chat.store import MessageRow, ModelInfo, Store, default_database_path
from macspec.cli import main
from macspec.errors import MacspecError


def one_line_error(capsys, argv: list[str]) -> str:
    """Run the CLI; assert exit 2 and one `macspec: error:` line; return that line."""
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("macspec: error: "), err
    assert "Traceback" not in err
    return lines[0]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- locked, read-only, full ------------------------------------------------------------------


def test_a_lock_held_by_another_process_is_one_line_and_passes(tmp_path: Path):
    path = tmp_path / "chats.db"
    store = Store(path, busy_timeout_s=0.2)
    cid = store.create_conversation("locked")
    with locked(path):
        with pytest.raises(StorageError, match="locked by another process .*0.2 s"):
            store.add_message(cid, "user", "waits")
        assert store.get(cid).messages == []  # reads go on (WAL)
    store.add_message(cid, "user", "once the lock is gone")
    assert [m.content for m in store.get(cid).messages] == ["once the lock is gone"]


def test_a_read_only_database_reads_and_refuses_writes_in_one_line(tmp_path: Path):
    path = tmp_path / "chats.db"
    cid = Store(path).create_conversation("kept")
    with read_only(path):
        store = Store(path)
        assert [c.title for c in store.list_conversations()] == ["kept"]
        with pytest.raises(StorageError, match=f"{path}: the chat database is read-only"):
            store.add_message(cid, "user", "refused")
    assert Store(path).get(cid).messages == []


def test_a_full_disk_is_one_line_and_a_save_is_all_or_nothing(disk):
    store = Store(disk.database)
    disk.adopt(store)
    cid = store.create_conversation("full")
    disk.fill()
    rows = [MessageRow("user", "x" * 50_000), MessageRow("assistant", "y" * 50_000)]
    with pytest.raises(StorageError, match="the disk is full"):
        store.save(cid, "", ModelInfo(), rows)
    assert store.get(cid).messages == []
    disk.free()
    _, ids = store.save(cid, "", ModelInfo(), rows)
    assert [m.id for m in store.get(cid).messages] == ids


# -- homes --------------------------------------------------------------------------------


def test_a_home_that_is_a_file_names_it(tmp_path, monkeypatch, capsys):
    home = tmp_path / "home"
    home.write_text("not a folder")
    monkeypatch.setenv("MACSPEC_HOME", str(home))
    line = one_line_error(capsys, ["chat"])  # the chat opens the home first
    assert f"{home}: the macspec home is a file, not a folder" in line
    # Reading it too: not "no stored conversations yet".
    for argv in (
        ["history"],
        ["history", "--json"],
        ["history", "show", "1"],
        ["history", "--export", "-"],
    ):
        assert "the macspec home is a file, not a folder" in one_line_error(capsys, argv)


def test_a_home_or_prompt_cache_folder_that_is_a_file_is_one_line_everywhere(
    tmp_path, monkeypatch, capsys
):
    from ggufkit import tiny_gguf

    model = tiny_gguf(tmp_path)
    home = tmp_path / "home"
    home.write_text("not a folder")
    monkeypatch.setenv("MACSPEC_HOME", str(home))
    said = f"{home}: the macspec home is a file, not a folder"
    for argv in (
        ["run", "--max-tokens", "1", "hi"],  # the prompt cache goes in the home
        ["serve", "--port", "0"],
        ["cache"],
        ["cache", "clear"],
        ["run", "--model", str(model), "--disk-cache-gb", "0", "hi"],  # its converted folder
    ):
        assert said in one_line_error(capsys, argv), argv
    monkeypatch.setenv("MACSPEC_HOME", str(tmp_path / "elsewhere"))
    said = f"{home}: the prompt cache folder is a file, not a folder"
    for argv in (
        ["cache", "--disk-cache-dir", str(home)],
        ["run", "--disk-cache-dir", str(home), "hi"],
    ):
        assert said in one_line_error(capsys, argv), argv


def test_a_read_only_home_names_it(tmp_path, monkeypatch, capsys):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("MACSPEC_HOME", str(home))
    with read_only(home):
        line = one_line_error(capsys, ["chat"])  # the chat opens the home first
    assert str(home) in line and "chats.db" in line
    assert "cannot create" in line or "not writable" in line


def test_a_home_under_a_read_only_folder_names_it(tmp_path, monkeypatch, capsys):
    parent = tmp_path / "parent"
    parent.mkdir()
    monkeypatch.setenv("MACSPEC_HOME", str(parent / "home"))
    with read_only(parent):
        line = one_line_error(capsys, ["chat"])  # the chat opens the home first
    assert f"{parent / 'home'}: cannot create the macspec home" in line


# -- fresh homes opened at once ------------------------------------------------------------


def open_fresh_homes(root: str, count: int, barrier, results) -> None:
    """In a child process: open `count` fresh homes, each at the same moment as the others."""
    for i in range(count):
        barrier.wait()
        try:
            Store(Path(root) / f"home{i}" / "chats.db").close()
            results.put(None)
        except Exception as exc:  # noqa: BLE001 - reported to the parent
            results.put(f"{type(exc).__name__}: {exc}")


def test_processes_opening_fresh_homes_at_once_all_succeed(tmp_path: Path):
    processes, homes = 4, 15
    spawn = multiprocessing.get_context("spawn")
    barrier, results = spawn.Barrier(processes), spawn.Queue()
    workers = [
        spawn.Process(target=open_fresh_homes, args=(str(tmp_path), homes, barrier, results))
        for _ in range(processes)
    ]
    for worker in workers:
        worker.start()
    outcomes = [results.get(timeout=120) for _ in range(processes * homes)]
    for worker in workers:
        worker.join(timeout=30)
    assert [o for o in outcomes if o] == []
    for i in range(homes):
        store = Store(tmp_path / f"home{i}" / "chats.db")
        assert len(store.applied_migrations()) == len(set(store.applied_migrations())) == 3


# -- schema versions and damage ------------------------------------------------------------


def stored_conversations(count: int = 3, messages: int = 30) -> list[int]:
    """Conversations in the default home, each message long enough to fill pages."""
    store = Store()
    ids = []
    for c in range(count):
        cid = store.create_conversation(f"chat {c}", ModelInfo("org/big", None, None))
        for m in range(messages):
            store.add_message(cid, "user", f"MARK-{c}-{m:03d} " + "words " * 60)
        ids.append(cid)
    store.close()
    return ids


def test_a_newer_schema_is_refused_naming_both_versions_and_nothing_is_written(capsys):
    stored_conversations(1, 2)
    path = default_database_path()
    with sqlite3.connect(path) as db:
        db.execute("INSERT INTO migrations VALUES ('0004_tags', 0)")
    db.close()
    before = digest(path)
    for argv in (["history"], ["history", "show", "1"], ["chat", "--continue"]):
        line = one_line_error(capsys, argv)
        assert "newer macspec" in line and "version 4" in line and "version 3" in line
        assert "0004_tags" in line and "nothing was written" in line
    assert digest(path) == before
    with pytest.raises(MacspecError, match="newer macspec"):
        Store(path)


def test_a_renamed_column_is_one_line(capsys):
    (cid,) = stored_conversations(1, 2)
    with sqlite3.connect(default_database_path()) as db:
        db.execute("ALTER TABLE messages RENAME COLUMN reasoning TO thoughts")
    db.close()
    line = one_line_error(capsys, ["history", "show", str(cid)])
    assert "damaged" in line and "reasoning" in line and "--export" in line


def test_a_damaged_page_is_one_line_and_the_rest_can_be_exported(tmp_path, capsys):
    ids = stored_conversations()
    path = default_database_path()
    damage_page_of(path, b"MARK-2-015")  # in the latest conversation
    for argv in (["history", "show", str(ids[2])], ["chat", "--continue"]):
        line = one_line_error(capsys, argv)
        assert f"{path}: the chat database is damaged" in line
        assert "macspec history --export" in line and "mv " in line
    with pytest.raises(DamagedDatabase):
        Store().get(ids[2])

    out = tmp_path / "rescued.json"
    assert main(["history", "--export", str(out)]) == 0
    err = capsys.readouterr().err
    exported = json.loads(out.read_text())
    assert [c["id"] for c in exported] == ids
    texts = [m["content"][:10] for c in exported for m in c["messages"]]
    assert "MARK-2-015" not in texts  # lost with its page ...
    assert "MARK-0-000" in texts and "MARK-1-029" in texts  # ... and only what was on it
    lost = 90 - len(texts)
    assert 0 < lost < 30
    assert f"exported 3 conversations ({len(texts)} messages)" in err
    assert f"{lost} rows could not be read" in err


@pytest.mark.parametrize("header", [b"", b"SQLite format 3\x00"], ids=["noise", "header"])
def test_export_of_a_file_with_no_readable_table_is_one_line(capsys, header):
    """Nothing can be read: one line that says so, not millions of 'rows' that never were."""
    path = default_database_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(header + random.Random(0).randbytes(8000))
    line = one_line_error(capsys, ["history", "--export", "-"])
    assert f"{path}: nothing in it can be read" in line and "mv " in line


def test_export_of_a_locked_database_says_locked_not_damaged(capsys):
    stored_conversations(1, 1)
    other = sqlite3.connect(str(default_database_path()), isolation_level=None)
    other.execute("PRAGMA locking_mode=EXCLUSIVE")  # not even readers, until it closes
    other.execute("BEGIN EXCLUSIVE")
    other.execute("DELETE FROM messages WHERE id < 0")
    try:
        line = one_line_error(capsys, ["history", "--export", "-"])
    finally:
        other.close()
    assert "locked by another process" in line and "nothing in it" not in line


def test_the_move_aside_command_survives_a_space_in_the_home():
    from macspec.chat.faults import move_aside

    path = Path("/Users/me/Library/Application Support/macspec/chats.db")
    assert shlex.split(move_aside(path)) == ["mv", str(path), f"{path}.damaged"]


def test_export_of_a_healthy_database_is_history_show_json(capsys):
    (cid,) = stored_conversations(1, 3)
    assert main(["history", "show", str(cid), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert main(["history", "--export", "-"]) == 0
    (exported,) = json.loads(capsys.readouterr().out)
    assert exported == shown


def test_ids_sqlite_cannot_hold_are_unknown_ids(capsys):
    stored_conversations(1, 1)
    huge = "99999999999999999999"
    for argv in (["history", "show", huge], ["chat", "--resume", huge]):
        assert f"no conversation with id {huge}" in one_line_error(capsys, argv)
    with pytest.raises(MacspecError, match="no conversation with id -1"):
        Store().get(-1)
