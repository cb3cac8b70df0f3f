"""Prompts to tune on: a JSONL file (chat messages or plain prompts) or the stored conversations.

Light: no MLX. Every problem with a file is one line naming the file and the line.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from macspec.errors import EMPTY_PROMPT, MacspecError, is_empty_prompt, read_user_text

ROLES = ("system", "user", "assistant")


@dataclass(frozen=True)
class TunePrompt:
    """A conversation up to the point where the target answers."""

    messages: tuple[tuple[str, str], ...]
    """(role, content) pairs, ending with a user turn."""
    where: str
    """Where it came from, for messages: 'prompts.jsonl:12' or 'history #3'."""

    def as_messages(self) -> list[dict[str, str]]:
        """The chat template's input: [{"role": ..., "content": ...}, ...]."""
        return [{"role": role, "content": content} for role, content in self.messages]


def read_prompts(path: Path, what: str = "--prompts") -> list[TunePrompt]:
    """Prompts from a file, one per line: `{"prompt": TEXT}`, `{"messages": [...]}` (a trailing
    assistant turn is dropped: the target answers anew), a JSON string, or a plain text line.
    Blank lines are skipped; no prompt at all is an error."""
    text = read_user_text(path, what)
    prompts = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            prompts.append(parse_line(line, f"{path}:{number}"))
    if not prompts:
        raise MacspecError(f"{what} {path}: the file is empty (no prompts)")
    return prompts


def parse_line(line: str, where: str) -> TunePrompt:
    """One line of a prompts file; malformed JSON or fields are an error naming `where`."""
    stripped = line.strip()
    if not stripped.startswith(("{", "[", '"')):
        return TunePrompt((("user", stripped),), where)
    try:
        value = json.loads(stripped)
    except ValueError as exc:
        raise MacspecError(f"{where}: not valid JSON ({exc})") from None
    if isinstance(value, str):
        return _single(value, where)
    if not isinstance(value, dict):
        raise MacspecError(f'{where}: expected {{"prompt": ...}} or {{"messages": [...]}}')
    if "messages" in value:
        return _conversation(value["messages"], where)
    if "prompt" in value:
        if not isinstance(value["prompt"], str):
            raise MacspecError(f"{where}: 'prompt' must be a string")
        return _single(value["prompt"], where)
    raise MacspecError(f"{where}: no 'prompt' or 'messages' field")


def _single(text: str, where: str) -> TunePrompt:
    if is_empty_prompt(text):
        raise MacspecError(f"{where}: {EMPTY_PROMPT}")
    return TunePrompt((("user", text),), where)


def _conversation(messages: object, where: str) -> TunePrompt:
    if not isinstance(messages, list) or not messages:
        raise MacspecError(f"{where}: 'messages' must be a non-empty list")
    turns = []
    for i, message in enumerate(messages):
        ok = isinstance(message, dict) and isinstance(message.get("content"), str)
        if not ok or message.get("role") not in ROLES:
            raise MacspecError(
                f'{where}: message {i + 1} must be {{"role": system|user|assistant, '
                '"content": TEXT}'
            )
        turns.append((message["role"], message["content"]))
    while turns and turns[-1][0] == "assistant":  # the target writes the answer itself
        turns.pop()
    if not turns or turns[-1][0] != "user":
        raise MacspecError(f"{where}: 'messages' must end with a user turn")
    return TunePrompt(tuple(turns), where)


def history_prompts(conversations: list[list[tuple[str, str]]]) -> list[TunePrompt]:
    """A prompt for every user turn of every stored conversation: the conversation up to it,
    earlier answers as they were stored. `conversations` are (role, content) lists by id."""
    prompts = []
    for number, turns in enumerate(conversations, start=1):
        for end, (role, content) in enumerate(turns):
            if role == "user" and not is_empty_prompt(content):
                prompts.append(TunePrompt(tuple(turns[: end + 1]), f"history #{number}"))
    return prompts


def read_history(database: Path) -> tuple[list[TunePrompt], int]:
    """Prompts from the chat store at `database`, and how many conversations they came from.
    A missing database is no history: nothing is created."""
    if not database.is_file():
        return [], 0
    from macspec.chat.store import Store

    store = Store(database)
    try:
        conversations = []
        for summary in store.list_conversations()[::-1]:  # oldest first
            messages = store.get(summary.id).messages
            conversations.append([(m.role, m.content) for m in messages if m.role in ROLES])
    finally:
        store.close()
    prompts = history_prompts(conversations)
    return prompts, len({p.where for p in prompts})


def split_held_out(
    prompts: list[TunePrompt], fraction: float, most: int, seed: int
) -> tuple[list[TunePrompt], list[TunePrompt]]:
    """(train, held out): a seeded random `fraction` (at least 1, at most `most`) held out."""
    if len(prompts) < 2:
        raise MacspecError(
            "need at least 2 prompts to hold some out for measuring (or pass --held-out FILE)"
        )
    order = list(range(len(prompts)))
    random.Random(seed).shuffle(order)
    n = min(most, max(1, round(fraction * len(prompts))), len(prompts) - 1)
    held = set(order[:n])
    train = [p for i, p in enumerate(prompts) if i not in held]
    return train, [prompts[i] for i in sorted(held)]
