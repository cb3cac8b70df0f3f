"""The chat as a new user meets it: narrow terminals, the welcome line, the pickers' hints,
choosing the pair in use; snapshots at 80x24 and 60x20 (120x40 is in test_tui)."""

from __future__ import annotations

import pytest
from test_tui import CURRENT, OTHER, SIZE, _one_turn, _snapshot_app, ask, build, items, until


@pytest.mark.asyncio
@pytest.mark.parametrize("size", [(120, 40), (80, 24), (60, 20)])
async def test_narrow_terminals_keep_the_numbers_and_drop_the_sparkline_first(tok, store, size):
    app, _, _ = build(tok, store)
    async with app.run_test(size=size) as pilot:
        await ask(pilot, "hello there")
        await pilot.pause()
        bar = app.stats_bar
        figures = str(bar.query_one("#figures").render())
        for needed in ("tok/s", "accept", "of", "tok/pass"):
            assert needed in figures, (size, figures)
        width = size[0]
        sparkline = bar.query_one("#acceptance")
        assert sparkline.display == (width >= 100), (size, figures)
        # no line of the bar wraps: each is one row, within the bar
        for row in ("#status", "#figures"):
            widget = bar.query_one(row)
            assert widget.size.height == 1 and len(str(widget.render())) <= width - 2
        # the quit key shows in the footer, inside the screen
        from textual.widgets._footer import FooterKey

        quit_key = next(k for k in app.query(FooterKey) if k.action == "quit")
        assert quit_key.region.width > 0 and quit_key.region.right <= width


@pytest.mark.asyncio
async def test_small_things_a_new_user_meets(tok, store):
    """The welcome line names the pair; choosing the pair in use says so rather than
    'Switched'; the pickers say that Esc closes them."""
    from tui.widgets.pickers import HistoryPicker, PairPicker

    loads = []
    app, _, _ = build(tok, store, loads=loads)
    async with app.run_test(size=(60, 20)) as pilot:
        assert items(app)[0][1].startswith("Chatting with tiny.")
        await pilot.press("ctrl+p")
        await until(pilot, lambda: isinstance(app.screen, PairPicker))
        hint = str(app.screen.query_one(".picker-hint").render())
        assert "esc closes" in hint
        # the title is not cut at 60 columns
        title = app.screen.query_one(".picker-title")
        assert str(title.render()) == "Switch pair" and title.region.right <= 60
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, PairPicker))
        await pilot.press("ctrl+r")
        await until(pilot, lambda: isinstance(app.screen, HistoryPicker))
        assert "esc closes" in str(app.screen.query_one(".picker-hint").render())
        await pilot.press("escape")
    # the pair in use, chosen again: no reload, one line
    app, _, _ = build(tok, store, loads=loads, list_pairs=lambda: [OTHER, CURRENT])
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("ctrl+p")
        await until(pilot, lambda: isinstance(app.screen, PairPicker))
        await pilot.press("down", "enter")  # the second option: the pair in use
        await until(pilot, lambda: any("Already using tiny." == t for _, t in items(app)))
        assert loads == [] and not any(t.startswith("Switched") for _, t in items(app))


def test_the_demo_pair_welcome_says_what_it_can_do():
    from tui.wording import welcome

    line = welcome("demo (demo target + demo draft)", "demo")
    assert "small Python functions" in line and "macspec pull NAME" in line
    assert "small Python functions" not in welcome("qwen3-8b", "qwen3-8b")


@pytest.mark.parametrize("size", [(80, 24), (60, 20)])
def test_snapshot_main_screen_on_narrow_terminals(tok, tmp_path, snap_compare, size):
    app = _snapshot_app(tok, tmp_path)
    assert snap_compare(app, terminal_size=size, run_before=_one_turn)


def test_a_reopened_answer_is_summarised_as_it_was_shown():
    """A stopped answer reads 'cancelled, saved as incomplete' live and when reopened, with the
    same acceptance wording; one token is 'token'."""
    from macspec.chat.records import StoredMessage
    from macspec.chat.store import ModelInfo
    from macspec.engine.core.events import Done, Source
    from macspec.engine.core.stats import Stats
    from tui.messages import Finished
    from tui.turn import answer_summary, stored_summary

    stats = Stats(generated_tokens=1, end_tokens=0, target_passes=1, plain_reason="plain: x")
    stored = StoredMessage(
        1, "assistant", "a", False, 1, "cancelled", stats.to_dict(), ModelInfo("t", "d"), 0.0
    )
    line = stored_summary(stored)
    assert line == "1 token · plain: x · 1.00 tokens/pass · cancelled, saved as incomplete"
    done = Done("cancelled", "a", "", [1], [Source.TARGET], stats)
    live, _ = answer_summary(Finished(done, None, None))
    assert live.endswith("1.00 tokens/pass · ttft 0.00s · cancelled, saved as incomplete")
    stats = Stats(generated_tokens=9, target_passes=3, draft_proposed=8, draft_accepted=6)
    stored = StoredMessage(
        2, "assistant", "b", True, 9, "stop", stats.to_dict(), ModelInfo("t", "d"), 0.0
    )
    assert (
        stored_summary(stored) == "9 tokens · acceptance 75% of 8 guesses · 3.00 tokens/pass · stop"
    )


def test_the_live_rate_shows_mid_answer_as_the_engine_counts_it(tok):
    """tok/s is there while the answer streams (not '–' until the end), over the tokens after
    the first pass's, as the engine's own Stats counts them."""
    from chatkit import tiny_engine, tiny_pair

    from macspec.engine.core.events import Done, Token
    from macspec.engine.generate.loop import GenerationConfig
    from tui.live import LiveFigures, figures_line

    ticks = iter(range(10_000))
    live = LiveFigures(clock=lambda: float(next(ticks)))
    events = list(tiny_engine(tok, *tiny_pair(tok)).generate([1, 2, 3], GenerationConfig(24)))
    done = events[-1]
    assert isinstance(done, Done) and done.stats.steady_tokens > 0
    seen = 0
    for event in events[:-1]:
        live.add(event)
        seen += isinstance(event, Token)
        if seen == len(done.tokens) // 2:  # mid-answer
            figures = live.figures()
            assert figures.decode_tokens_per_s is not None and not figures.finished
            assert "– tok/s" not in figures_line(figures)
    assert live._stats.steady_tokens == done.stats.steady_tokens


def test_a_finished_drafted_answer_shows_its_draft_length_not_plain():
    """The status bar after an answer whose last steps were plain (no room left to guess):
    'k 3', the length it drafted at, not 'plain'; 'plain' only when it never guessed."""
    from macspec.engine.core.events import Cycle, Done
    from macspec.engine.core.stats import Stats
    from tui.live import LiveFigures, figures_line

    def cycle(requested: int, proposed: int) -> Cycle:
        return Cycle(requested=requested, proposed=proposed, accepted=proposed, draft_s=0.0,
                     verify_s=0.0, overhead_s=0.0, draft_steps=proposed, draft_fed=proposed,
                     fed=proposed + 1, refed=0)  # fmt: skip

    def finished(cycles: list[Cycle]) -> str:
        live = LiveFigures()
        for event in cycles:
            live.add(event)
        live.add(Done(finish_reason="length", text="", tail="", tokens=[], sources=[],
                      stats=Stats()))  # fmt: skip
        return figures_line(live.figures())

    assert "k 3" in finished([cycle(3, 3), cycle(3, 3), cycle(0, 0)])
    assert "plain" in finished([cycle(0, 0), cycle(0, 0)])
