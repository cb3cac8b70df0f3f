"""`macspec chat` and `macspec history` through the CLI entry point (the UI runs headless)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from macspec.chat.store import ModelInfo, Store
from macspec.cli import main
from macspec.engine.policy.length import FixedPolicy
from tui.app import ChatApp


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MACSPEC_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def stored_chat(title: str = "hello there") -> int:
    store = Store()
    cid = store.create_conversation(title, ModelInfo("org/big", "org/small", "big"))
    store.add_message(cid, "user", title)
    answer = store.add_message(cid, "assistant", "", complete=False)
    store.update_answer(answer, "general **kenobi**", False, 3, "cancelled", {"x": 1})
    return cid


def test_history_lists_and_shows(home, capsys):
    assert main(["history"]) == 0
    assert "no stored conversations" in capsys.readouterr().out
    assert main(["history", "--json"]) == 0 and json.loads(capsys.readouterr().out) == []
    assert main(["history", "show", "1"]) == 2
    assert "no conversation with id 1" in capsys.readouterr().err
    assert not home.exists()  # looking creates no home and no database
    first, second = stored_chat("first chat"), stored_chat("second chat")

    assert main(["history"]) == 0
    out = capsys.readouterr().out
    assert "first chat" in out and "second chat" in out and "big" in out
    assert out.index("second chat") < out.index("first chat")  # latest first

    assert main(["history", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [c["id"] for c in listed] == [second, first]
    assert listed[0]["message_count"] == 2 and listed[0]["pair"] == "big"

    assert main(["history", "show", str(first)]) == 0
    out = capsys.readouterr().out
    assert "first chat" in out and "general **kenobi**" in out and "incomplete" in out

    assert main(["history", "show", str(first), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [m["role"] for m in shown["messages"]] == ["user", "assistant"]
    answer = shown["messages"][1]
    assert (answer["complete"], answer["finish_reason"], answer["stats"]) == (
        False,
        "cancelled",
        {"x": 1},
    )


@pytest.mark.parametrize(
    "argv, message",
    [
        (["history", "show", "42"], "no conversation with id 42"),
        (["history", "show", "abc"], "'CONVERSATION_ID'"),
        (["chat", "--resume", "42"], "no conversation with id 42"),
        (["chat", "--resume", "1", "--continue"], "--resume and --continue"),
        (["chat", "--model", "/no/such/folder"], "no such model folder"),
    ],
)
def test_bad_input_is_one_line_exit_2(home, capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("macspec: error: ") and message in err
    assert "Traceback" not in err


def test_chat_passes_flags_to_the_engine_and_session(home, tiny_model_folder, monkeypatch, capsys):
    cid = stored_chat()
    seen: list[ChatApp] = []
    monkeypatch.setattr(ChatApp, "run", lambda self, **kwargs: seen.append(self))
    monkeypatch.setattr("macspec.cli.chat.require_terminal", lambda: None)  # runs headless
    folder = str(tiny_model_folder)
    argv = [
        "chat",
        "--model",
        folder,
        "--draft-model",
        folder,
        "--continue",
        "--num-draft-tokens",
        "2",
        "--max-tokens",
        "77",
        "--temp",
        "0.5",
        "--seed",
        "3",
    ]
    assert main(argv) == 0
    (app,) = seen
    session = app.session
    assert session.conversation_id == cid and len(session.messages) == 2
    assert isinstance(session.engine.policy, FixedPolicy) and session.engine.policy.k == 2
    assert session.engine.drafter is not None
    assert session.config.max_tokens == 77 and session.config.seed == 3
    assert session.config.sampling.temperature == 0.5
    assert session.models == ModelInfo(target=folder, draft=folder, pair=None)
    assert f"conversation {cid} saved" in capsys.readouterr().err


def test_chat_end_to_end_headless(home, tiny_model_folder, monkeypatch):
    """The real command: two questions, two answers, quit; everything is saved."""
    run = ChatApp.run

    async def script(pilot) -> None:
        app = pilot.app
        for question in ("first question", "second question"):
            ended = app.turns_ended
            await pilot.press(*question, "enter")
            while app.turns_ended == ended:
                await pilot.pause(0.02)
        await pilot.press("ctrl+q")

    monkeypatch.setattr(
        ChatApp, "run", lambda self, **kw: run(self, headless=True, auto_pilot=script)
    )
    monkeypatch.setattr("macspec.cli.chat.require_terminal", lambda: None)  # runs headless
    folder = str(tiny_model_folder)
    argv = ["chat", "--model", folder, "--draft-model", folder, "--max-tokens", "12", "-k", "2"]
    assert main(argv) == 0
    (conversation,) = Store().list_conversations()
    messages = Store().get(conversation.id).messages
    assert [(m.role, m.complete) for m in messages] == [
        ("user", True),
        ("assistant", True),
        ("user", True),
        ("assistant", True),
    ]
    assert messages[1].token_count and messages[1].models.target == folder
    # The draft is the target itself: every guess is accepted.
    assert messages[1].stats["acceptance_rate"] == 1.0


@pytest.mark.parametrize("stdin", [b"hi\n", None], ids=["a pipe", "/dev/null"])
def test_chat_without_a_terminal_is_one_line_not_a_hang(home, tiny_model_folder, stdin):
    """`echo hi | macspec chat` in a script: refused before any model loads."""
    argv = [sys.executable, "-m", "macspec", "chat", "--model", str(tiny_model_folder)]
    done = subprocess.run(
        argv,
        input=stdin,
        stdin=subprocess.DEVNULL if stdin is None else None,
        capture_output=True,
        timeout=60,
    )
    err = done.stderr.decode()
    assert done.returncode == 2, err
    assert err.strip() == (
        "macspec: error: macspec chat needs a terminal, and stdin is not one; for a prompt "
        "from a pipe or a script, use `macspec run` (or `macspec serve`)"
    )
