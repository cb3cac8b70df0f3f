"""Strict tools: a forced call (tool_choice 'required' or a named function) whose arguments
must fit the function's `parameters`, as a Lark grammar in the model's own call format.

The grammar writes the whole call, start tag to end tag, the name among the allowed ones and
the arguments through llguidance's `%json`; the tags are the tokenizer's own tokens where it
has one for them (`<tool_call>` is one id in Qwen's vocabulary), so the answer is what the
model would write. Formats other than mlx-lm's `json_tools` (Hermes / Qwen) keep the forced
opening in the prompt, their arguments unconstrained.
"""

from __future__ import annotations

import json
from typing import Any

from macspec.engine.core.grammar import Grammar
from macspec.models.tools import ToolFormat

COMPACT = {"x-guidance": {"whitespace_flexible": False}}
"""The arguments as compact JSON, as llguidance's JSON schemas are elsewhere in macspec."""


def strict_names(tools: list[dict[str, Any]]) -> frozenset[str]:
    """The names of the tools marked strict (OpenAI's `function.strict`, or a top-level
    `strict` as the Responses API and Anthropic put it)."""
    names = set()
    for tool in tools:
        function = tool.get("function") or tool
        if function.get("strict") or tool.get("strict"):
            names.add(function.get("name"))
    return frozenset(n for n in names if isinstance(n, str))


def forced_call_grammar(
    fmt: ToolFormat,
    tokenizer: Any,
    tools: list[dict[str, Any]],
    name: str | None,
    strict: frozenset[str],
) -> Grammar | None:
    """The grammar of one forced call to `name` (None: any of `tools`), its arguments held to
    the function's parameters; None when this format or these tools are not strict."""
    if fmt.name != "json_tools" or not fmt.start or not fmt.end:
        return None
    functions = [t.get("function") or {} for t in tools]
    chosen = [f for f in functions if name is None or f.get("name") == name]
    if not chosen or any(f.get("name") not in strict for f in chosen):
        return None
    rules, calls = [], []
    for i, function in enumerate(chosen):
        schema = function.get("parameters") or {"type": "object", "properties": {}}
        head = json.dumps(f'\n{{"name": {json.dumps(function["name"])}, "arguments": ')
        calls.append(f"call{i}")
        rules.append(f"call{i}: {head} args{i}")
        rules.append(f"args{i}: %json {json.dumps({**COMPACT, **schema})}")
    start = _tag(tokenizer, fmt.start)
    end = _tag(tokenizer, fmt.end)
    top = f"start: {start} ({' | '.join(calls)}) {json.dumps(chr(125) + chr(10))} {end}"
    return Grammar("lark", "\n".join([top, *rules]))


def _tag(tokenizer: Any, text: str) -> str:
    """A tag in Lark: the token itself where the vocabulary has it as one id, else its text."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) == 1 and text.startswith("<") and text.endswith(">"):
        return text  # llguidance's reference to a special token by name
    return json.dumps(text)
