"""Words the chat shows that belong to no widget: the welcome line of a new chat."""

from __future__ import annotations

DEMO_NOTE = (
    "The demo pair is tiny (3 MB): it writes small Python functions in the standard library's "
    "style, not conversation. Try:\n"
    "Write a Python method `Misc.keys(self)`: Return a list of all resource names of this widget."
    "\nFor a real model, quit and run `macspec models`, then `macspec pull NAME`."
)


def welcome(label: str, pair: str | None) -> str:
    """The first line of a new chat: which pair, the keys, and what the demo is for."""
    line = f"Chatting with {label}. Enter sends, ctrl+j adds a line, esc stops an answer."
    return f"{line}\n{DEMO_NOTE}" if pair == "demo" else line
