"""A chat session when storage fails: the conversation goes on, nothing is lost, every
message is saved exactly once when storage works again, and what never could be saved is
written to a file. Faults: a lock held by another connection, a read-only file, a full disk
(a real tmpfs where it can be mounted)."""

from __future__ import annotations

import json
from pathlib import Path

from chatkit import tiny_engine, tiny_pair
from faultkit import locked, read_only

from macspec.chat import session as session_module
from macspec.chat.journal import describe_unsaved, rescue
from macspec.chat.session import ChatSession, NotSaved
from macspec.chat.store import ModelInfo, Store
from macspec.engine.core.events import Done, Token
from macspec.engine.generate.loop import GenerationConfig

MODELS = ModelInfo(target="tiny/target", draft="tiny/draft", pair="tiny")


def session_for(tok, store: Store, max_tokens: int = 24, **kwargs) -> ChatSession:
    target, draft = tiny_pair(tok, eos_bias=-1e4)
    return ChatSession(
        tiny_engine(tok, target, draft),
        tok,
        store,
        config=GenerationConfig(max_tokens=max_tokens),
        models=MODELS,
        **kwargs,
    )


def done_of(events) -> Done:
    (done,) = [e for e in events if isinstance(e, Done)]
    return done


def stored(store: Store) -> list[tuple[str, str, bool, str | None]]:
    """(role, content, complete, finish_reason) of every stored message, in order."""
    return [
        (m.role, m.content, m.complete, m.finish_reason)
        for c in sorted(store.list_conversations(), key=lambda c: c.id)
        for m in store.get(c.id).messages
    ]


def test_a_locked_database_at_the_start_of_a_turn_loses_nothing(tok, tmp_path):
    path = tmp_path / "chats.db"
    store = Store(path, busy_timeout_s=0.2)
    chat = session_for(tok, store)
    with locked(path):
        events = list(chat.send("hello there"))
    # Said at once, before the answer; the answer still comes.
    assert isinstance(events[0], NotSaved)
    assert "locked by another process" in events[0].problem and str(path) in events[0].problem
    first = done_of(events)
    assert first.text and chat.messages[-1]["content"] == first.text
    assert chat.messages[0] == {"role": "user", "content": "hello there"}
    assert store.list_conversations() == [] and chat.unsaved == 2 and not chat.answer_saved

    # The next turn saves the first one too, once, in order.
    second = done_of(chat.send("and again"))
    assert chat.unsaved == 0 and chat.answer_saved
    assert stored(store) == [
        ("user", "hello there", True, None),
        ("assistant", first.text, True, "length"),
        ("user", "and again", True, None),
        ("assistant", second.text, True, "length"),
    ]


def test_a_read_only_database_keeps_the_turn_until_a_retry_saves_it(tok, tmp_path):
    path = tmp_path / "chats.db"
    Store(path).close()
    with read_only(path):
        store = Store(path)
        chat = session_for(tok, store)
        events = list(chat.send("hello there"))
        (notice,) = [e for e in events if isinstance(e, NotSaved)]
        assert "read-only" in notice.problem and "ctrl+s retries" in notice.text
        assert chat.save_pending() is not None and chat.unsaved == 2
    assert chat.save_pending() is None and chat.unsaved == 0
    assert chat.save_pending() is None  # nothing more to do: saved once
    text = done_of(events).text
    assert stored(store) == [
        ("user", "hello there", True, None),
        ("assistant", text, True, "length"),
    ]


def test_a_full_disk_mid_answer_never_claims_a_save(tok, disk, monkeypatch):
    monkeypatch.setattr(session_module, "SAVE_EVERY_S", 0.0)
    store = Store(disk.database)
    disk.adopt(store)
    chat = session_for(tok, store, max_tokens=60)
    seen, problems = [], []
    for event in chat.send("fill the disk"):
        if isinstance(event, Token):
            seen.append(event.text)
            if len(seen) == 5:
                disk.fill()
        elif isinstance(event, NotSaved):
            problems.append(event.problem)
    assert len(problems) == 1 and "the disk is full" in problems[0]
    answer = "".join(seen)
    assert chat.messages[-1]["content"] == answer and not chat.answer_saved
    (_, reply) = store.get(chat.conversation_id).messages
    assert reply.content != answer and answer.startswith(reply.content)  # only what got there
    assert not reply.complete and reply.finish_reason is None

    lines = describe_unsaved(chat.journal.unsaved)
    assert len(lines) == 1 and "the answer" in lines[0] and "its latest text" in lines[0]
    disk.free()
    assert chat.save_pending() is None
    (_, reply) = store.get(chat.conversation_id).messages
    assert (reply.content, reply.complete, reply.finish_reason) == (answer, True, "length")


def test_a_new_chat_keeps_the_unsaved_messages_of_the_old_one(tok, tmp_path):
    path = tmp_path / "chats.db"
    store = Store(path, busy_timeout_s=0.1)
    chat = session_for(tok, store)
    with locked(path):
        first = done_of(chat.send("the first chat"))
        chat.new_conversation()
        second = done_of(chat.send("the second chat"))
        assert chat.unsaved == 4
    assert chat.save_pending() is None
    conversations = sorted(store.list_conversations(), key=lambda c: c.id)
    assert [c.title for c in conversations] == ["the first chat", "the second chat"]
    assert [m.content for m in store.get(conversations[0].id).messages] == [
        "the first chat",
        first.text,
    ]
    assert chat.conversation_id == conversations[1].id
    assert chat.messages[-1]["content"] == second.text


def test_what_was_never_saved_is_written_to_a_temp_file(tok, tmp_path):
    path = tmp_path / "chats.db"
    store = Store(path, busy_timeout_s=0.1)
    chat = session_for(tok, store)
    with locked(path):
        text = done_of(chat.send("keep me")).text
        problem = str(chat.save_pending())
    rescued = rescue(chat.journal.unsaved, path, problem)
    assert rescued.parent.name.startswith("macspec-unsaved-")
    record = json.loads(Path(rescued).read_text())
    assert record["database"] == str(path) and "locked" in record["problem"]
    (conversation,) = record["conversations"]
    assert conversation["conversation_id"] is None and conversation["title"] == "keep me"
    assert [(m["role"], m["content"]) for m in conversation["messages"]] == [
        ("user", "keep me"),
        ("assistant", text),
    ]
    lines = describe_unsaved(chat.journal.unsaved)
    assert lines[0] == 'a new conversation "keep me": your message "keep me": all of it'


def test_an_answer_stops_at_the_context_window_with_its_own_reason(tok, tmp_path):
    store = Store(tmp_path / "chats.db")
    chat = session_for(tok, store, max_tokens=10_000, context_length=60)
    done = done_of(chat.send("hi"))
    assert done.finish_reason == "context"
    assert len(chat.last_prompt) + len(done.tokens) == 60
    (_, reply) = store.get(chat.conversation_id).messages
    assert (reply.finish_reason, reply.complete) == ("context", True)


def test_a_full_disk_at_the_start_of_a_turn_keeps_it_for_later(tok, disk):
    store = Store(disk.database)
    disk.adopt(store)
    chat = session_for(tok, store)
    disk.fill()
    events = list(chat.send("no room"))
    assert isinstance(events[0], NotSaved) and "the disk is full" in events[0].problem
    assert chat.unsaved == 2 and store.list_conversations() == []
    disk.free()
    assert chat.save_pending() is None
    assert stored(store) == [
        ("user", "no room", True, None),
        ("assistant", done_of(events).text, True, "length"),
    ]
