"""Words the chat shows that belong to no widget: the welcome line of a new chat."""

from __future__ import annotations

DEMO_NOTE = (
    "The demo pair is tiny (3 MB): it writes small Python functions in the standard library's "
    "style, not conversation (try: Write a Python function `is_even(n)`: Return True if n is "
    "even). For a real model: `macspec models`, then `macspec pull NAME`."
)


def welcome(label: str, pair: str | None) -> str:
    """The first line of a new chat: which pair, the keys, and what the demo is for."""
    line = f"Chatting with {label}. Enter sends, ctrl+j adds a line, esc stops an answer."
    return f"{line}\n{DEMO_NOTE}" if pair == "demo" else line
