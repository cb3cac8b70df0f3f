"""OpenAI Responses API requests (`POST /v1/responses`), as Codex CLI sends them, translated
into a ChatTurn.

Input items: messages (`input_text` / `output_text` parts, or a string), `function_call`,
`function_call_output` and `reasoning` items. Function tools only: other tool types (web
search, a hosted shell...) are not offered to the model, with one log line. Fields this schema
does not know (`store`, `include`, `prompt_cache_key`...) are accepted and ignored; a
`text.format` json_schema / json_object constrains the answer; `background` is a 400.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from macspec.serve.errors import APIError
from macspec.serve.formats import responses_format
from macspec.serve.notes import log_once
from macspec.serve.tool_grammar import strict_names
from macspec.serve.turn import ChatTurn, ToolChoice

EFFORT_OFF = ("none", "minimal")
"""`reasoning.effort` values that turn a thinking model's reasoning off."""


class Reasoning(BaseModel):
    model_config = ConfigDict(extra="ignore")

    effort: str | None = None
    summary: str | None = None


class NamedChoice(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: str
    name: str | None = None


class ResponsesRequest(BaseModel):
    """POST /v1/responses."""

    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1)
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedChoice | None = None
    parallel_tool_calls: bool | None = None
    reasoning: Reasoning | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    stream: StrictBool = False
    previous_response_id: str | None = None
    store: bool | None = None
    metadata: dict[str, Any] | None = None
    text: dict[str, Any] | None = None
    background: bool | None = None

    def unsupported(self) -> APIError | None:
        """The first field set to something macspec cannot do, as a 400."""
        if self.background:
            return APIError(400, "background responses are not supported", "background")
        return None

    def function_tools(self) -> list[dict[str, Any]]:
        """The function tools, in the chat templates' shape; a `namespace` tool's functions
        among them (Codex groups some that way)."""
        tools = []
        for tool in flat_tools(self.tools or []):
            if tool.get("type") != "function" or not tool.get("name"):
                log_once(f"tool of type '{tool.get('type')}' is not a function: not offered")
                continue
            function = {
                "name": tool["name"],
                "parameters": tool.get("parameters") or {"type": "object", "properties": {}},
            }
            if tool.get("description"):
                function["description"] = tool["description"]
            tools.append({"type": "function", "function": function})
        return tools

    def to_turn(self, history: list[dict[str, Any]] | None = None) -> ChatTurn:
        """The request as a ChatTurn; `history`: the messages of `previous_response_id`."""
        problem = self.unsupported()
        if problem is not None:
            raise problem
        messages: list[dict[str, Any]] = []
        if self.instructions:
            messages.append({"role": "system", "content": self.instructions})
        messages += history or []
        messages += input_messages(self.input)
        choice = self.tool_choice
        if isinstance(choice, NamedChoice):
            if choice.type != "function" or not choice.name:
                raise APIError(400, "tool_choice: only function tools can be named", "tool_choice")
            tool_choice = ToolChoice("function", choice.name)
        else:
            tool_choice = ToolChoice(choice or "auto")
        args: dict[str, Any] = {}
        effort = self.reasoning.effort if self.reasoning is not None else None
        if effort is not None:
            args["enable_thinking"] = effort not in EFFORT_OFF
            if effort not in EFFORT_OFF:
                args["reasoning_effort"] = effort  # gpt-oss's template reads it
        return ChatTurn(
            messages=messages,
            tools=self.function_tools(),
            tool_choice=tool_choice,
            parallel_tool_calls=self.parallel_tool_calls is not False,
            template_args=args,
            temperature=self.temperature,
            top_p=self.top_p,
            max_tokens=self.max_output_tokens,
            field_prefix="input",
            grammar=responses_format(self.text),
            strict_tools=strict_names(flat_tools(self.tools or [])),
            grammar_param="text.format",
        )


def flat_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tools with each namespace's functions in its place, each marked with its namespace."""
    flat = []
    for tool in tools:
        if tool.get("type") == "namespace":
            inner = tool.get("tools") or []
            flat += [{**t, "namespace": tool.get("name")} for t in inner if isinstance(t, dict)]
        else:
            flat.append(tool)
    return flat


def namespaces(tools: list[dict[str, Any]] | None) -> dict[str, str]:
    """Function name -> the namespace it was offered in (Responses names it in the call)."""
    return {t["name"]: t["namespace"] for t in flat_tools(tools or []) if t.get("namespace")}


def part_text(content: Any, where: str) -> str:
    """The text of a message's content: a string, or input_text / output_text parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise APIError(400, f"{where}: content must be a string or a list of parts", where)
    texts = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text", "reasoning_text", "summary_text"):
            texts.append(str(part.get("text", "")))
        elif kind in ("input_image", "input_file", "input_audio"):
            raise APIError(400, f"{where}.{i}: {kind} is not supported: macspec serves text models")
        else:
            raise APIError(400, f"{where}.{i}: content parts of type '{kind}' are not supported")
    return "".join(texts)


def input_messages(items: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Input items -> chat-template messages: consecutive function calls (and the text and
    reasoning before them) make one assistant message, each call's output a tool message."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for i, item in enumerate(items):
        where = f"input.{i}"
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise APIError(400, f"{where}.role: unknown role '{role}'", f"{where}.role")
            message = {
                "role": "system" if role == "developer" else role,
                "content": part_text(item.get("content", ""), f"{where}.content"),
            }
            if role == "assistant" and reasoning:
                message["reasoning"], reasoning = "\n".join(reasoning), []
            messages.append(message)
        elif kind == "reasoning":
            parts = item.get("content") or item.get("summary") or []
            reasoning.append(part_text(parts, f"{where}.content"))
        elif kind == "function_call":
            last = messages[-1] if messages else None
            if last is None or last["role"] != "assistant":  # calls after text join its message
                last = {"role": "assistant", "content": ""}
                messages.append(last)
            if reasoning:
                last["reasoning"], reasoning = "\n".join(reasoning), []
            arguments = item.get("arguments", "{}")
            if not isinstance(arguments, str):
                arguments = json.dumps(arguments)
            function = {"name": str(item.get("name", "")), "arguments": arguments}
            call = {"id": item.get("call_id"), "type": "function", "function": function}
            last.setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            output = item.get("output", "")
            content = output if isinstance(output, str) else part_text(output, f"{where}.output")
            messages.append(
                {"role": "tool", "tool_call_id": item.get("call_id"), "content": content}
            )
        elif kind == "item_reference":
            raise APIError(400, f"{where}: item references need a stored response", where)
        else:
            raise APIError(400, f"{where}: input items of type '{kind}' are not supported", where)
    return messages
