"""How the chat ends (tui/quitting.py), with tiny models: Esc stops an answer and keeps it,
ctrl+q mid-answer saves it, and one ctrl+q never throws away text typed but not sent."""

from __future__ import annotations

import pytest
from test_tui import SIZE, build, until

from tui.widgets.transcript import AnswerMessage


@pytest.mark.asyncio
async def test_escape_stops_the_answer_and_keeps_it(tok, store):
    app, target, _ = build(tok, store, max_tokens=2000, eos_bias=-1e4)
    target.slow_after, target.slow_s = 12, 0.02  # slow enough to press Esc mid-answer
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press(*"go on and on", "enter")
        await until(pilot, lambda: app.generating and target.slowed.is_set())
        answer = app.transcript.query(AnswerMessage).last()
        await until(pilot, lambda: answer.text != "")
        await pilot.press("escape")
        await until(pilot, lambda: not app.generating, timeout=10)
        await app.workers.wait_for_complete()

        reply = store.get(app.session.conversation_id).messages[-1]
        assert (reply.complete, reply.finish_reason) == (False, "cancelled")
        assert 0 < reply.token_count < 2000
        assert answer.text == reply.content != ""
        # The finish reason README and `run --json` name, said once.
        assert answer.summary.endswith(" · cancelled, saved as incomplete")
        assert "stopped" not in answer.summary and answer.summary.count("cancelled") == 1
        assert len(answer.summary) < SIZE[0] - 4  # on one line, not cut
        assert app.session.messages[-1] == {"role": "assistant", "content": reply.content}


@pytest.mark.asyncio
async def test_quit_mid_answer_saves_it(tok, store):
    app, target, _ = build(tok, store, max_tokens=2000, eos_bias=-1e4)
    target.slow_after, target.slow_s = 12, 0.02
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press(*"never ending", "enter")
        await until(pilot, lambda: target.slowed.is_set())
        await pilot.press("ctrl+q")
        await until(pilot, lambda: not app.is_running, timeout=15)
    reply = store.get(store.latest_conversation_id()).messages[-1]
    assert (reply.complete, reply.finish_reason) == (False, "cancelled")
    assert reply.content and reply.token_count < 2000


@pytest.mark.asyncio
async def test_quit_with_unsent_text_asks_once_more(tok, store):
    app, _, _ = build(tok, store)
    notes: list[str] = []
    app.notify = lambda message, **kwargs: notes.append(message)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press(*"half a thought")
        await pilot.press("ctrl+q")
        await pilot.pause()
        assert app.is_running and app.prompt.text == "half a thought"
        assert notes == ["Your message is not sent: ctrl+q again to quit without it."]
        await pilot.press("ctrl+q")
        await until(pilot, lambda: not app.is_running, timeout=15)
    assert store.latest_conversation_id() is None  # nothing was sent, nothing stored
