"""Prompt sets for `macspec bench`: the built-in one, and the user's own from a file.

The built-in set lives in this module rather than a data file, so it ships without any
package-data entry. It covers the kinds of text where drafts do well (code, summaries of a
given text, which repeat their input) and badly (open writing, where anything goes).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from macspec.errors import MacspecError, read_user_text


@dataclass(frozen=True)
class BenchPrompt:
    """One prompt of a benchmark."""

    name: str
    """Short label for tables and JSON."""
    category: str
    """'chat', 'code', 'summary', 'writing', or 'user' for the user's own."""
    text: str
    """The user turn (the chat template is applied when the tokenizer has one)."""


_ARTICLE = (
    "The city council voted on Tuesday to convert the old tram depot on Mill Street into a "
    "public library and community workshop. The building, which has stood empty since the "
    "tram line closed in 1994, will keep its brick facade and iron roof. Work is expected to "
    "start next spring and take two years; the council has set aside 14 million for it, and "
    "a local foundation has promised another 3 million for the workshop's tools. Some "
    "residents asked for housing on the site instead, but the council said the soil needs "
    "years of cleaning before anyone can live there."
)

BUILTIN: tuple[BenchPrompt, ...] = (
    BenchPrompt("chat-tea", "chat", "How do I make a good cup of green tea?"),
    BenchPrompt(
        "chat-sleep", "chat", "I keep waking up at 4 am. What are some things I could try?"
    ),
    BenchPrompt(
        "code-dedupe",
        "code",
        "Write a Python function `dedupe(items)`: Return the items in their original order "
        "with duplicates removed.",
    ),
    BenchPrompt(
        "code-parse",
        "code",
        "Write a Python function `parse_duration(text)`: Parse a duration such as '1h30m' or "
        "'45s' and return the number of seconds as an int.",
    ),
    BenchPrompt(
        "summary-depot",
        "summary",
        f"Summarise this news item in three sentences:\n\n{_ARTICLE}",
    ),
    BenchPrompt(
        "summary-points",
        "summary",
        f"List the key facts of this text as short bullet points:\n\n{_ARTICLE}",
    ),
    BenchPrompt(
        "writing-lighthouse",
        "writing",
        "Write a short story about a lighthouse keeper who finds a letter in a bottle.",
    ),
    BenchPrompt("writing-poem", "writing", "Write a poem about the first snow of winter."),
)

_CODE = '''def moving_average(values, window):
    """Return the averages of each run of `window` consecutive values."""
    averages = []
    for start in range(len(values) - window + 1):
        chunk = values[start:start + window]
        averages.append(sum(chunk) / window)
    return averages
'''

GROUNDED: tuple[BenchPrompt, ...] = (
    BenchPrompt(
        "edit-rename",
        "edit",
        "Rename `values` to `samples` in this function and return the whole function:\n\n"
        f"```python\n{_CODE}```",
    ),
    BenchPrompt(
        "edit-docstring",
        "edit",
        "Add a line to the docstring saying that `window` must be positive, and return the "
        f"whole function:\n\n```python\n{_CODE}```",
    ),
    BenchPrompt(
        "edit-typehints",
        "edit",
        f"Add type hints to this function and return it:\n\n```python\n{_CODE}```",
    ),
    BenchPrompt(
        "summary-depot",
        "summary",
        f"Summarise this news item in three sentences:\n\n{_ARTICLE}",
    ),
    BenchPrompt(
        "rewrite-plain",
        "summary",
        f"Rewrite this text in plain words for a ten-year-old:\n\n{_ARTICLE}",
    ),
    BenchPrompt(
        "quote-facts",
        "summary",
        f"Quote the two sentences of this text that give money figures:\n\n{_ARTICLE}",
    ),
)
"""Input-grounded prompts (edit this code, summarise this text): where answers repeat their
context, so prompt lookup drafting (`--draft lookup`) has something to find."""

PROMPT_SETS = {"builtin": BUILTIN, "grounded": GROUNDED}

QUICK_NAMES = ("chat-tea", "code-dedupe", "summary-depot", "writing-lighthouse")
"""One prompt of each kind, for `--quick`."""


def builtin(quick: bool = False, name: str = "builtin") -> list[BenchPrompt]:
    """A built-in set by name ('builtin', 'grounded'); `quick` keeps one prompt of each kind."""
    if name not in PROMPT_SETS:
        raise MacspecError(f"--prompt-set must be one of {', '.join(PROMPT_SETS)}, got {name!r}")
    chosen = PROMPT_SETS[name]
    if quick and name == "builtin":
        return [p for p in chosen if p.name in QUICK_NAMES]
    return list(chosen)


def load_prompts(path: Path) -> list[BenchPrompt]:
    """The user's prompts: one per line, or JSONL with a "prompt" field (and "name" optional).

    The file is JSONL when its first non-empty line starts with '{'. Empty lines are skipped.
    """
    text = read_user_text(path, "--prompts")
    lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not lines:
        raise MacspecError(f"--prompts {path}: the file has no prompts")
    if not lines[0][1].lstrip().startswith("{"):
        return [BenchPrompt(f"prompt-{i}", "user", line) for i, (_, line) in enumerate(lines, 1)]
    prompts = []
    for i, (number, line) in enumerate(lines, 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise MacspecError(f"--prompts {path}:{number}: not valid JSON ({exc.msg})") from None
        prompt = record.get("prompt") if isinstance(record, dict) else None
        if not isinstance(prompt, str) or not prompt.strip():
            raise MacspecError(f'--prompts {path}:{number}: needs a non-empty "prompt" string')
        name = record.get("name")
        category = record.get("category")
        prompts.append(
            BenchPrompt(
                str(name) if name else f"prompt-{i}",
                str(category) if category else "user",
                prompt,
            )
        )
    return prompts
