"""Tool calls in the model's own format: which one a tokenizer speaks, how a call is parsed,
how the answer is made to start with one, and how a conversation with tool calls is rendered.

mlx-lm infers the format from the chat template and ships a parser for most families
(`TokenizerWrapper.tool_parser`, `tool_call_start`, `tool_call_end`: `json_tools` for Qwen3's
`<tool_call>{json}</tool_call>`, `qwen3_coder` for Qwen3.5/3.6's XML, `gemma4`, `mistral`,
`glm47`, `kimi_k2`, ...). Two catalog families have none there, and are written here: gpt-oss's
harmony channels (`harmony.py`) and Llama 3.1/3.3's bare JSON calls.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

ParseFn = Callable[[str, "list[dict] | None"], Any]
"""mlx-lm's parser signature: the text between the tags (and the request's tools) -> one call
{'name', 'arguments'} or a list of them; raises ValueError when the text is not a call."""


@dataclass(frozen=True)
class ToolCall:
    """One parsed call."""

    name: str
    arguments: dict[str, Any]
    id: str
    """The id clients send back with the result (`call_...` / `toolu_...` are added per API)."""

    @property
    def arguments_json(self) -> str:
        return json.dumps(self.arguments, ensure_ascii=False)


def new_call_id() -> str:
    return uuid.uuid4().hex[:24]


@dataclass(frozen=True)
class ToolFormat:
    """How one model family writes tool calls."""

    name: str
    """mlx-lm's parser name ('json_tools', 'qwen3_coder', ...), or 'harmony', 'llama3_json'."""
    start: str
    """Text that opens a call ('<tool_call>'); '' for formats whose whole answer is the call."""
    end: str
    """Text that closes one; '' where a call runs to the end of the answer."""
    parse_fn: ParseFn | None = None

    def parse(self, body: str, tools: list[dict] | None = None) -> list[ToolCall]:
        """The calls in the text between a start and an end tag; ValueError when it is not one."""
        if self.parse_fn is None:
            raise ValueError(f"no parser for the {self.name} format")
        try:
            parsed = self.parse_fn(body, tools)
        except (ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
            raise ValueError(str(exc) or type(exc).__name__) from None
        return [_as_call(p) for p in (parsed if isinstance(parsed, list) else [parsed])]

    def opening(self, name: str | None) -> str:
        """Text that makes the answer start with a call (`tool_choice` 'required', or a named
        function): the start tag, and the name where this format puts it first."""
        # No space after the last colon: BPE tokenizers fold it into what follows (' {"'),
        # and a lone space token is a boundary the model never saw before its arguments.
        if name is not None and self.name == "json_tools":
            return f'{self.start}\n{{"name": {json.dumps(name)}, "arguments":'
        if name is not None and self.name == "qwen3_coder":
            return f"{self.start}\n<function={name}>\n"
        if name is not None and self.name == "harmony":
            return f"{self.start}{name} <|constrain|>json<|message|>"
        if self.name == "llama3_json":
            return '{"name": ' + (f'{json.dumps(name)}, "parameters":' if name else "")
        return self.start


def _as_call(parsed: Any) -> ToolCall:
    if not isinstance(parsed, dict) or not isinstance(parsed.get("name"), str):
        raise ValueError("a call needs a name")
    arguments = parsed.get("arguments", parsed.get("parameters", {}))
    if isinstance(arguments, str):  # double-encoded by the model: decode it once
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            raise ValueError("the arguments are not JSON") from None
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise ValueError("the arguments are not a JSON object")
    call_id = parsed.get("id") if isinstance(parsed.get("id"), str) else new_call_id()
    return ToolCall(parsed["name"].strip(), arguments, call_id)


def parse_llama3_json(text: str, tools: list[dict] | None = None) -> list[dict]:
    """Llama 3.1/3.3's calls: `{"name": ..., "parameters": {...}}`, optionally after
    `<|python_tag|>`, several separated by ';' or newlines."""
    text = text.strip().removeprefix("<|python_tag|>").strip()
    decoder = json.JSONDecoder()
    calls, at = [], 0
    while at < len(text):
        value, at = decoder.raw_decode(text, at)
        if not isinstance(value, dict) or "name" not in value:
            raise ValueError("not a call")
        if "arguments" not in value and "parameters" not in value:
            raise ValueError("a call needs its parameters")
        calls.append(value)
        while at < len(text) and text[at] in " \t\r\n;":
            at += 1
    if not calls:
        raise ValueError("no call")
    return calls


LLAMA3_JSON = ToolFormat("llama3_json", "", "", parse_llama3_json)
HARMONY = ToolFormat("harmony", "<|channel|>commentary to=functions.", "<|call|>")
"""gpt-oss: parsed by harmony.HarmonyStream, which follows its channels."""


def template_text(tokenizer) -> str:
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # several named templates
        template = template.get("tool_use") or template.get("default")
    return template if isinstance(template, str) else ""


def tool_format(tokenizer) -> ToolFormat | None:
    """The tool-call format of a model, from its tokenizer (mlx-lm's inference first); None
    when the model has no way to call tools."""
    template = template_text(tokenizer)
    if "<|channel|>" in template and "to=functions" in template:
        return HARMONY
    parse_fn = getattr(tokenizer, "tool_parser", None)
    start = getattr(tokenizer, "tool_call_start", None)
    if parse_fn is not None and start:
        name = getattr(parse_fn, "__module__", "").rsplit(".", 1)[-1] or "mlx-lm"
        return ToolFormat(name, start, getattr(tokenizer, "tool_call_end", "") or "", parse_fn)
    if "<|python_tag|>" in template or ('"parameters"' in template and "ipython" in template):
        return LLAMA3_JSON
    return None


def history_message(message: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI-style message for the chat template: tool calls' arguments as objects (the
    templates write them with `tojson`; a JSON string would be written twice encoded)."""
    calls = message.get("tool_calls")
    if not calls:
        return message
    rendered = []
    for call in calls:
        function = dict(call.get("function") or {})
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                function["arguments"] = json.loads(arguments) if arguments.strip() else {}
            except ValueError:
                pass  # the template writes it as it came
        rendered.append({**call, "function": function})
    return {**message, "tool_calls": rendered}


def template_messages(tokenizer, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as the model's chat template reads them: tool calls' arguments as objects, and
    an assistant's earlier reasoning under the key the template uses (`reasoning_content` for
    Qwen3, `thinking` for gpt-oss), so the prompt repeats what the model generated (and its
    cached prefix is reused) where the template keeps reasoning."""
    template = template_text(tokenizer)
    keys = [k for k in ("reasoning_content", "thinking") if k in template]
    rendered = []
    for message in messages:
        message = history_message(dict(message))
        reasoning = message.pop("reasoning", None)
        if message.get("content") is None:
            message["content"] = ""
        if reasoning and message.get("role") == "assistant":
            both = message.get("tool_calls") and message["content"]  # gpt-oss: one or the other
            message.update({key: reasoning for key in keys if not (both and key == "thinking")})
        rendered.append(message)
    return rendered
