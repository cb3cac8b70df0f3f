"""The transcript widget alone, in a bare host app: how an answer is shown as it streams."""

from __future__ import annotations

import pytest

from tui.widgets.transcript import Transcript


@pytest.mark.asyncio
async def test_an_answer_that_turns_markdown_mid_stream_shows_all_of_it():
    """With the colours off, plain text is shown preformatted and the Markdown body is not fed;
    once the answer turns Markdown the body catches up with the whole text, not just the
    fragment that turned it."""
    from textual.app import App

    from macspec.engine.core.events import Source

    class Host(App):  # no '-sources' class: the Markdown / preformatted views show
        def compose(self):
            yield Transcript()

    async with Host().run_test() as pilot:
        answer = await pilot.app.query_one(Transcript).add_answer()
        await answer.add_tokens([("some plain words\n", Source.TARGET)])
        assert answer.has_class("-plain")
        await answer.add_tokens([("\n# A heading\n\n- one\n", Source.DRAFT)])
        assert not answer.has_class("-plain")
        assert (
            answer.query_one(".body").source
            == answer.text
            == ("some plain words\n\n# A heading\n\n- one\n")
        )
