"""Modal pickers: a downloaded pair to switch to, a past conversation to resume."""

from __future__ import annotations

import time
from collections.abc import Sequence

from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, OptionList
from textual.widgets.option_list import Option

from macspec.chat.store import ConversationSummary
from macspec.models.catalog import Pair


class _Picker(ModalScreen):
    """A titled OptionList; Enter picks, Esc closes with None (the hint under the title says
    so). Title and hint wrap on a narrow terminal rather than being cut."""

    BINDINGS = [Binding("escape", "dismiss_none", "Close")]

    def __init__(self, title: str, options: Sequence[Option], empty: str, hint: str = "") -> None:
        super().__init__()
        self.title_text = title
        self.hint = " · ".join(part for part in (hint, "enter picks, esc closes") if part)
        self.options = list(options)
        self.empty = empty

    def compose(self):
        with Vertical(classes="picker"):
            yield Label(self.title_text, classes="picker-title")
            yield Label(self.hint, classes="picker-hint")
            if self.options:
                yield OptionList(*self.options)
            else:
                yield Label(self.empty, classes="picker-empty")

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.dismiss(event.option.id)

    def action_dismiss_none(self) -> None:
        self.dismiss(None)


class PairPicker(_Picker):
    """Downloaded catalog pairs; dismisses with the chosen pair's name."""

    def __init__(self, pairs: Sequence[Pair], current: str | None) -> None:
        options = [
            Option(f"{'● ' if p.name == current else '  '}{p.name}  —  {p.description}", id=p.name)
            for p in pairs
        ]
        super().__init__(
            "Switch pair",
            options,
            "No downloaded pairs. Run `macspec models` and `macspec pull NAME`.",
            hint="downloaded pairs; `macspec pull NAME` gets more",
        )


def _when(timestamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(timestamp))


class HistoryPicker(_Picker):
    """Stored conversations, latest first; dismisses with the chosen id (as a string)."""

    def __init__(self, conversations: Sequence[ConversationSummary], current: int | None):
        options = [
            Option(
                f"{'● ' if c.id == current else '  '}#{c.id}  {c.title}  "
                f"({c.message_count} messages, {_when(c.updated_at)})",
                id=str(c.id),
            )
            for c in conversations
        ]
        super().__init__("Resume a conversation", options, "No stored conversations yet.")
