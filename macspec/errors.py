"""Errors a user can cause: the CLI prints them as one line and exits with code 2."""

from __future__ import annotations

from collections.abc import Sequence

EXIT_USER_ERROR = 2
"""Bad input or environment: one line on stderr."""
EXIT_INCOMPLETE = 3
"""`run --json-schema/--regex/--grammar`: the answer ended (--max-tokens, the context, a stop
text) before its grammar was complete, so it does not match it; said in one line on stderr."""
EXIT_INTERRUPTED = 130
"""Ctrl-C (128 + SIGINT). A command that says so itself (a stats line) ends with QuietExit(130)."""


EMPTY_PROMPT = "the prompt is empty"
"""What every path (run, chat, serve's APIs, tune, the engine) says of a prompt with nothing
in it; whitespace is not nothing (`is_empty_prompt`)."""


def is_empty_prompt(prompt: str | Sequence[int]) -> bool:
    """Whether a prompt, as text or as ids, has nothing to feed: no characters, or no ids.

    Whitespace is content: a raw completion continues code or a document of blank lines, and
    OpenAI's completions API takes it. Only nothing at all is refused, the same on every path.
    """
    return len(prompt) == 0


class MacspecError(Exception):
    """A problem with the user's input or environment, stated in one line.

    Anything else that escapes is a bug and keeps its traceback.
    """


class QuietExit(Exception):
    """End the command with `code` and print nothing: the error was reported elsewhere (a rank
    other than 0 of a distributed run, whose rank 0 says what happened)."""

    def __init__(self, code: int = 2):
        super().__init__(code)
        self.code = code


def read_user_text(path, what: str) -> str:
    """A file the user named (`what` is its flag, e.g. '--prompts'), as UTF-8 text; a missing
    or unreadable one is one line."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise MacspecError(f"{what} {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise MacspecError(f"{what} {path}: cannot read it ({exc})") from None
