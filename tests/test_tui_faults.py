"""The chat app when storage fails: never frozen, the message kept on screen and in memory,
one line saying why it is not saved, ctrl+s saves it once storage works; what is on screen
and what is in the database are both checked. And quitting says what was never saved."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from faultkit import locked, read_only
from test_tui import SIZE, ask, build, items, until

from macspec.chat.session import ChatSession
from macspec.chat.store import Store
from macspec.cli import main
from tui.app import ChatApp
from tui.widgets.transcript import AnswerMessage


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory):
    from chatkit import tiny_tokenizer

    return tiny_tokenizer(tmp_path_factory.mktemp("tok"))


def notices(app: ChatApp) -> list[str]:
    return [text for kind, text in items(app) if kind == "notice"]


def stored(store: Store) -> list[tuple[str, str]]:
    return [
        (m.role, m.content)
        for c in sorted(store.list_conversations(), key=lambda c: c.id)
        for m in store.get(c.id).messages
    ]


@pytest.mark.asyncio
async def test_a_locked_database_never_freezes_the_chat_and_a_retry_saves_once(tok, tmp_path):
    path = tmp_path / "chats.db"
    store = Store(path, busy_timeout_s=0.2)
    app, _, _ = build(tok, store)
    async with app.run_test(size=SIZE) as pilot:
        with locked(path):
            first = await ask(pilot, "hello there")
            assert not app.generating and app.stats_bar.state == "ready"
            (line,) = [n for n in notices(app) if n.startswith("Not saved")]
            assert f"{path}: the chat database is locked by another process" in line
            assert "ctrl+s retries" in line
            assert items(app)[-3:] == [
                ("user", "hello there"),  # still on screen
                ("notice", line),  # said before the answer
                ("answer", first.text),
            ]
            assert "not saved" in first.summary and "saved as incomplete" not in first.summary
            assert app.session.messages[-2:] == [
                {"role": "user", "content": "hello there"},
                {"role": "assistant", "content": first.text},
            ]
            # Not "Still answering": the next message goes through (and is kept too).
            second = await ask(pilot, "still there?")
            assert second.text and app.session.unsaved == 4
            await pilot.press("ctrl+s")
            await until(pilot, lambda: any(n.startswith("Still not saved") for n in notices(app)))
            await app.workers.wait_for_complete()
            assert stored(store) == []

        await pilot.press("ctrl+s")
        await until(pilot, lambda: "Saved 4 messages kept in memory." in notices(app))
        await app.workers.wait_for_complete()
        await pilot.press("ctrl+s")  # nothing left: saved once
        await pilot.pause()
        third = await ask(pilot, "saved now")
        assert "not saved" not in third.summary
    assert stored(store) == [
        ("user", "hello there"),
        ("assistant", first.text),
        ("user", "still there?"),
        ("assistant", second.text),
        ("user", "saved now"),
        ("assistant", third.text),
    ]


@pytest.mark.asyncio
async def test_a_full_disk_mid_answer_is_never_called_saved(tok, disk, monkeypatch):
    from macspec.chat import session as session_module

    monkeypatch.setattr(session_module, "SAVE_EVERY_S", 0.0)
    store = Store(disk.database)
    disk.adopt(store)
    app, target, _ = build(tok, store, max_tokens=300, eos_bias=-1e4)
    target.slow_after, target.slow_s = 10, 0.01
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press(*"fill it up", "enter")
        await until(pilot, lambda: target.slowed.is_set())
        answer = app.transcript.query(AnswerMessage).last()
        await until(pilot, lambda: answer.text != "")
        disk.fill()
        await until(pilot, lambda: not app.generating, timeout=60)
        await app.workers.wait_for_complete()
        await pilot.pause()
        (line,) = [n for n in notices(app) if n.startswith("Not saved")]
        assert "the disk is full" in line
        assert "not saved" in answer.summary and "saved as" not in answer.summary
        assert answer.text and app.session.messages[-1]["content"] == answer.text
        user, reply = store.get(app.session.conversation_id).messages
        assert user.content == "fill it up"
        assert reply.content != answer.text and answer.text.startswith(reply.content)
        assert reply.finish_reason is None  # the end never got there, and nobody says it did


@pytest.mark.asyncio
async def test_any_failure_before_the_answer_ends_the_turn(tok, tmp_path, monkeypatch):
    """The original freeze: an exception that is not a MacspecError out of send()."""

    def broken(self, messages):
        raise sqlite3.OperationalError("database is locked")

    app, _, _ = build(tok, Store(tmp_path / "chats.db"))
    notes: list[str] = []
    app.notify = lambda message, **kwargs: notes.append(message)
    async with app.run_test(size=SIZE) as pilot:
        monkeypatch.setattr(ChatSession, "plan", broken)
        await pilot.press(*"hello", "enter")
        await until(pilot, lambda: app.turns_ended == 1)
        assert not app.generating and items(app)[-1][0] == "notice"
        assert notes == ["OperationalError: database is locked"]
        assert app.prompt.text == "hello"  # given back to send again
        monkeypatch.undo()
        app.prompt.clear()
        answer = await ask(pilot, "again")
        assert answer.text


def test_quitting_says_exactly_what_was_not_saved(tmp_path, tiny_model_folder, monkeypatch, capsys):
    """The real command, a read-only chats.db: the turn is kept, quitting writes it to a file
    in a temp folder and says so; exit 2."""
    monkeypatch.setenv("MACSPEC_HOME", str(tmp_path / "home"))
    database = Store().path
    run = ChatApp.run

    async def script(pilot) -> None:
        app = pilot.app
        await pilot.press(*"keep this safe", "enter")
        await until(pilot, lambda: app.turns_ended == 1)
        await pilot.press("ctrl+q")

    monkeypatch.setattr(
        ChatApp, "run", lambda self, **kw: run(self, headless=True, auto_pilot=script)
    )
    monkeypatch.setattr("macspec.cli.chat.require_terminal", lambda: None)  # runs headless
    folder = str(tiny_model_folder)
    with read_only(database):
        code = main(["chat", "--model", folder, "--max-tokens", "8", "--no-draft"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"macspec: error: {database}: the chat database is read-only" in err
    assert "2 messages could not be saved:" in err
    assert 'a new conversation "keep this safe": your message "keep this safe": all of it' in err
    assert "conversation" in err and "saved (macspec chat --resume" not in err
    path = Path(err.rsplit("they are in ", 1)[1].split()[0])
    record = json.loads(path.read_text())
    messages = record["conversations"][0]["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant"]
    assert messages[0]["content"] == "keep this safe" and messages[1]["token_count"] == 8
    assert Store().list_conversations() == []
