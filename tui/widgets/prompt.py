"""The multi-line prompt: Enter sends, ctrl+j (or shift+enter) starts a new line."""

from __future__ import annotations

from textual import events
from textual.binding import Binding
from textual.message import Message
from textual.widgets import TextArea

NEWLINE_KEYS = ("ctrl+j", "shift+enter", "alt+enter")


class PromptInput(TextArea):
    """A TextArea whose Enter submits the text instead of inserting a line break."""

    BINDINGS = [
        Binding("enter", "submit", "Send"),
        Binding(",".join(NEWLINE_KEYS), "newline", "Newline"),
    ]

    class Submitted(Message):
        """The user pressed Enter on a prompt."""

        def __init__(self, prompt: PromptInput, text: str) -> None:
            super().__init__()
            self.prompt = prompt
            self.text = text

    def __init__(self, **kwargs) -> None:
        super().__init__(soft_wrap=True, show_line_numbers=False, **kwargs)

    async def _on_key(self, event: events.Key) -> None:
        # TextArea inserts a line break on Enter before bindings run: intercept it here.
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            self.action_submit()
            return
        if event.key in NEWLINE_KEYS:
            event.stop()
            event.prevent_default()
            self.action_newline()
            return
        await super()._on_key(event)

    def action_submit(self) -> None:
        self.post_message(self.Submitted(self, self.text))

    def action_newline(self) -> None:
        self.insert("\n")
