"""The chat app with tiny models: Pilot tests of turns, crash, pairs, chats; snapshots (stopping
and quitting: test_tui_quitting.py)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from chatkit import tiny_engine, tiny_pair

from macspec.chat.session import ChatModels
from macspec.chat.store import ModelInfo, Store
from macspec.engine.drafters.lookup import HybridDrafter
from macspec.engine.drafters.model import ModelDrafter
from macspec.engine.generate.loop import GenerationConfig
from macspec.errors import MacspecError
from macspec.models.catalog import Pair
from tui.app import ChatApp
from tui.factory import make_app
from tui.widgets.transcript import AnswerMessage, Notice, UserMessage

MODELS = ModelInfo(target="tiny/target", draft="tiny/draft", pair="tiny")
OTHER = Pair(
    name="other",
    target="tiny/other",
    draft="tiny/other-draft",
    draft_policy=3,
    context_length=4096,
    description="Another tiny pair",
    size_gb=0.0,
)
CURRENT = Pair(
    name="tiny",
    target="tiny/target",
    draft="tiny/draft",
    draft_policy=3,
    context_length=4096,
    description="The tiny pair in use",
    size_gb=0.0,
)
SIZE = (120, 40)


def build(
    tok,
    store,
    *,
    max_tokens=40,
    eos_bias=-1.0,
    seed=0,
    loads=None,
    drafter_of=None,
    list_pairs=None,
    **kwargs,
):
    """The app around a fresh tiny pair; returns (app, target, draft)."""
    target, draft = tiny_pair(tok, seed=seed, eos_bias=eos_bias)

    def load(pair: Pair) -> ChatModels:
        other_target, other_draft = tiny_pair(tok, seed=7, eos_bias=-1.0)
        if loads is not None:
            loads.append(pair.name)
        models = ModelInfo(pair.target, pair.draft, pair.name)
        return ChatModels(
            tiny_engine(tok, other_target, other_draft),
            tok,
            models,
            pair.context_length,
            ("a warning about the other pair",),
        )

    app = make_app(
        tiny_engine(tok, target, draft, drafter_of=drafter_of),
        tok,
        store=store,
        models=MODELS,
        config=GenerationConfig(max_tokens=max_tokens),
        list_pairs=list_pairs or (lambda: [OTHER]),
        load_pair=load,
        mask_timings=True,
        **kwargs,
    )
    return app, target, draft


async def until(pilot, condition, timeout: float = 30.0) -> None:
    """Let the app run until `condition()` holds (workers post from their threads)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting for the app"
        await pilot.pause(0.02)


async def ask(pilot, text: str) -> AnswerMessage:
    app: ChatApp = pilot.app
    ended = app.turns_ended
    await pilot.press(*text)
    await pilot.press("enter")
    await until(pilot, lambda: app.turns_ended > ended)
    await app.workers.wait_for_complete()
    return app.transcript.query(AnswerMessage).last()


def items(app: ChatApp) -> list[tuple[str, str]]:
    kinds = {UserMessage: "user", AnswerMessage: "answer", Notice: "notice"}
    return [(kinds[type(w)], w.text) for w in app.transcript.children]


@pytest.mark.asyncio
async def test_a_turn_streams_into_the_transcript_and_stats(tok, store):
    app, _, _ = build(tok, store)
    async with app.run_test(size=SIZE) as pilot:
        answer = await ask(pilot, "hello there")
        stored = store.get(app.session.conversation_id).messages
        assert [(m.role, m.complete) for m in stored] == [("user", True), ("assistant", True)]
        assert stored[0].content == "hello there"
        assert answer.text == stored[1].content != ""
        assert items(app)[-2:] == [("user", "hello there"), ("answer", answer.text)]

        # The Markdown body and the coloured spans hold the same text; both sources appear.
        assert answer.query_one(".body").source == answer.text
        spans = answer.plain_spans
        assert "".join(text for text, _ in spans) == answer.text
        assert {source for _, source in spans} == {"draft", "target"}
        assert answer.draft_tokens + answer.target_tokens == stored[1].token_count

        # The stats bar shows the engine's final counts; the summary line is under the answer.
        figures = app.stats_bar.figures
        assert figures.finished and figures.tokens == stored[1].token_count
        assert figures.acceptance_rate == stored[1].stats["acceptance_rate"]
        assert figures.draft_length == 3 and figures.acceptance_history
        assert answer.summary.startswith(f"{stored[1].token_count} tokens")
        assert "acceptance" in answer.summary
        # guesses came from the draft model alone: no per-source line
        assert not app.stats_bar.query_one("#sources").display


@pytest.mark.asyncio
async def test_a_crash_in_the_worker_keeps_the_partial_answer(tok, store):
    app, target, _ = build(tok, store, max_tokens=400, eos_bias=-1e4)
    target.crash_after = 10  # the prefill, then nine cycles
    async with app.run_test(size=SIZE) as pilot:
        answer = await ask(pilot, "this will crash")
        assert app.is_running  # the app survives it
        assert "error: RuntimeError: simulated crash" in answer.summary
        user, reply = store.get(app.session.conversation_id).messages
        assert (user.role, user.content) == ("user", "this will crash")
        assert (reply.complete, reply.finish_reason) == (False, "error")
        assert reply.content == answer.text != ""


@pytest.mark.asyncio
async def test_switch_pair(tok, store):
    loads: list[str] = []
    app, _, _ = build(tok, store, loads=loads)
    async with app.run_test(size=SIZE) as pilot:
        await ask(pilot, "first with tiny")
        await pilot.press("ctrl+p")
        await until(pilot, lambda: len(app.screen_stack) == 2)
        await pilot.press("enter")  # the only downloaded pair, highlighted
        await until(pilot, lambda: app.session.models.pair == "other")
        assert loads == ["other"] and app.loading is None
        assert app.stats_bar.pair == "other"
        notices = [text for kind, text in items(app) if kind == "notice"]
        assert "Switched to other." in notices
        assert "warning: a warning about the other pair" in notices

        await ask(pilot, "now with other")
        stored = store.get(app.session.conversation_id).messages
        assert [m.models.pair for m in stored if m.role == "assistant"] == ["tiny", "other"]
        assert app.session.context_length == 4096


@pytest.mark.asyncio
async def test_a_pair_that_fails_to_load_keeps_the_current_one(tok, store):
    def broken(pair: Pair) -> ChatModels:
        raise MacspecError(f"pair '{pair.name}' is not downloaded")

    app, _, _ = build(tok, store)
    app.load_pair = broken
    notes: list[str] = []
    app.notify = lambda message, **kwargs: notes.append(message)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("ctrl+p")
        await until(pilot, lambda: len(app.screen_stack) == 2)
        await pilot.press("enter")
        await until(pilot, lambda: app.loading is None and len(app.screen_stack) == 1)
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert app.session.models == MODELS and app.stats_bar.pair == "tiny"
        assert notes == ["Could not load other: pair 'other' is not downloaded"]
        await ask(pilot, "still works")


@pytest.mark.asyncio
async def test_new_chat_and_resume_the_old_one(tok, store):
    app, _, _ = build(tok, store)
    async with app.run_test(size=SIZE) as pilot:
        first = await ask(pilot, "the first chat")
        first_id = app.session.conversation_id

        await pilot.press("ctrl+n")
        await until(pilot, lambda: not app.transcript.query(UserMessage))
        assert app.session.conversation_id is None and app.session.messages == []
        await ask(pilot, "a second chat")
        second_id = app.session.conversation_id
        assert second_id != first_id

        await pilot.press("ctrl+r")
        await until(pilot, lambda: len(app.screen_stack) == 2)
        await pilot.press("down", "enter")  # latest first: the old one is second
        await until(pilot, lambda: app.session.conversation_id == first_id)
        await until(pilot, lambda: app.transcript.query(UserMessage))
        assert items(app)[1:] == [("user", "the first chat"), ("answer", first.text)]
        resumed = app.transcript.query(AnswerMessage).last()
        # a reopened answer is coloured by the sources stored with it, as it was when written
        assert "-has-sources" in resumed.classes

        await ask(pilot, "back to the first")
        assert len(store.get(first_id).messages) == 4
        assert len(store.get(second_id).messages) == 2


@pytest.mark.asyncio
async def test_resume_at_start_shows_the_conversation(tok, store):
    app, _, _ = build(tok, store)
    async with app.run_test(size=SIZE) as pilot:
        answer = await ask(pilot, "remember this")
        conversation_id = app.session.conversation_id
    again, _, _ = build(tok, store, conversation_id=conversation_id)
    async with again.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert items(again)[1:] == [("user", "remember this"), ("answer", answer.text)]


@pytest.mark.asyncio
async def test_newline_key_and_multiline_send(tok, store):
    app, _, _ = build(tok, store)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press(*"line one", "ctrl+j", *"line two")
        assert app.prompt.text == "line one\nline two"
        await ask(pilot, "")
        assert store.get(app.session.conversation_id).messages[0].content == "line one\nline two"
        assert app.prompt.text == ""


@pytest.mark.asyncio
async def test_a_message_too_long_is_given_back(tok, store):
    app, _, _ = build(tok, store, context_length=40)
    async with app.run_test(size=SIZE) as pilot:
        app.prompt.text = "word " * 12
        await pilot.press("enter")
        await until(pilot, lambda: app.turns_ended == 1)
        await app.workers.wait_for_complete()
        assert app.prompt.text == "word " * 12
        assert not app.transcript.query(UserMessage)
        assert store.list_conversations() == []


@pytest.mark.asyncio
async def test_colour_toggle(tok, store):
    app, _, _ = build(tok, store)
    async with app.run_test(size=SIZE) as pilot:
        answer = await ask(pilot, "colours")
        assert answer.query_one(".spans").display and not answer.query_one(".body").display
        await pilot.press("ctrl+t")
        assert not app.colours and "-sources" not in app.classes
        # The tiny model writes no Markdown: its text shows preformatted, as written.
        assert answer.query_one(".plain").display
        assert not answer.query_one(".body").display and not answer.query_one(".spans").display


CODE = 'def is_nan(n):\n    """Return True if n is not a number."""\n    return n != n'


@pytest.mark.asyncio
async def test_answers_keep_their_lines_in_every_view_and_their_colours_when_reopened(tok, store):
    """Unfenced code is not Markdown: shown preformatted (line breaks and indentation kept);
    a reopened answer is coloured by its stored sources; Markdown still renders as Markdown."""
    conversation = store.create_conversation("code", MODELS)
    store.add_message(conversation, "user", "write is_nan")
    answer_id = store.add_message(conversation, "assistant", "")
    runs = [["def is_nan(n):\n", "target"], [CODE[15:], "draft"]]
    store.update_answer(answer_id, CODE, True, 20, "stop", sources=runs)
    store.add_message(conversation, "user", "and in markdown?")
    second = store.add_message(conversation, "assistant", "")
    store.update_answer(second, "# Heading\n\n- one\n- two", True, 8, "stop")
    app, _, _ = build(tok, store, conversation_id=conversation)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        code, markdown = app.transcript.query(AnswerMessage)
        assert code.plain_spans == [(CODE[:15], "target"), (CODE[15:], "draft")]
        assert code.query_one(".spans").display  # coloured as it was written
        await pilot.press("ctrl+t")
        plain = code.query_one(".plain")
        assert plain.display and not code.query_one(".body").display
        assert str(plain.render()).splitlines()[1] == '    """Return True if n is not a number."""'
        assert markdown.query_one(".body").display and not markdown.query_one(".plain").display


@pytest.mark.asyncio
async def test_lookup_guesses_show_their_acceptance_by_source(tok, store):
    def hybrid(model: ModelDrafter) -> HybridDrafter:
        return HybridDrafter(model, min_ngram=1, min_guess=1)

    app, _, _ = build(tok, store, max_tokens=80, drafter_of=hybrid)
    async with app.run_test(size=SIZE) as pilot:
        answer = await ask(pilot, "ab ab ab ab ab ab ab ab")
        reply = store.get(app.session.conversation_id).messages[-1]
        by_source = reply.stats["by_source"]
        assert set(by_source) == {"lookup", "model"}  # a random model repeats itself
        line = str(app.stats_bar.query_one("#sources").render())
        assert app.stats_bar.query_one("#sources").display
        for name, counts in by_source.items():
            rate = counts["accepted"] / counts["proposed"]
            assert f"{name} {rate:.0%} of {counts['proposed']}" in line
            assert f"{name} {rate:.0%} of {counts['proposed']}" in answer.summary
        # a new chat clears the figures, and the line with them
        await pilot.press("ctrl+n")
        assert not app.stats_bar.query_one("#sources").display


# -- snapshots (deterministic: greedy, fixed models, timings masked) --------------------------


def _snapshot_app(tok, tmp_path: Path) -> ChatApp:
    app, _, _ = build(tok, Store(tmp_path / "snap.db"), max_tokens=60)
    return app


async def _one_turn(pilot) -> None:
    pilot.app.prompt.cursor_blink = False  # a blinking cursor would make the screen flaky
    await ask(pilot, "What is speculative decoding?")
    await asyncio.sleep(0)


def test_snapshot_main_screen_after_an_answer(tok, tmp_path, snap_compare):
    app = _snapshot_app(tok, tmp_path)
    assert snap_compare(app, terminal_size=SIZE, run_before=_one_turn)


def test_snapshot_main_screen_colours_off(tok, tmp_path, snap_compare):
    app = _snapshot_app(tok, tmp_path)

    async def turn_then_toggle(pilot) -> None:
        await _one_turn(pilot)
        await pilot.press("ctrl+t")

    assert snap_compare(app, terminal_size=SIZE, run_before=turn_then_toggle)
