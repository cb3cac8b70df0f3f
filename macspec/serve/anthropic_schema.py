"""Anthropic Messages API requests (`POST /v1/messages`, `/v1/messages/count_tokens`), as the
`anthropic` SDK and Claude Code send them, translated into a ChatTurn.

Content blocks: `text`, `tool_use`, `tool_result` (a string or text blocks), `thinking` and
`redacted_thinking` in the history; an image or a document is a 400 (macspec serves text
models). Fields this schema does not know (`cache_control`, `context_management`,
`output_config`, `metadata`...) are accepted and ignored, as Anthropic's clients send many.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from macspec.serve.errors import APIError
from macspec.serve.formats import anthropic_format
from macspec.serve.notes import log_once
from macspec.serve.turn import ChatTurn, ToolChoice

MAX_STOPS = 16


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["user", "assistant", "system"]
    content: str | list[dict[str, Any]]


class ToolSpec(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str = Field(min_length=1)
    type: str | None = None
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    strict: bool | None = None
    """A forced call's input is held to input_schema (structured outputs)."""


class ToolChoiceIn(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class Thinking(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(default=None, ge=0)


class CountRequest(BaseModel):
    """POST /v1/messages/count_tokens: a conversation without the generation settings."""

    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1)
    messages: list[Message] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[ToolSpec] | None = None
    tool_choice: ToolChoiceIn | None = None
    thinking: Thinking | None = None

    def to_turn(self, **settings: Any) -> ChatTurn:
        """The conversation as a ChatTurn (with `settings` for generation)."""
        messages = []
        system = text_of(without_billing(self.system), "system") if self.system else ""
        if system:
            messages.append({"role": "system", "content": system})
        for i, message in enumerate(self.messages):
            messages.extend(translate(message, f"messages.{i}.content"))
        choice = self.tool_choice or ToolChoiceIn(type="auto")
        mode = {"auto": "auto", "any": "required", "tool": "function", "none": "none"}
        if choice.type == "tool" and not choice.name:
            raise APIError(400, "tool_choice of type 'tool' needs a name", "tool_choice.name")
        args: dict[str, Any] = {}
        budget = None
        if self.thinking is not None and self.thinking.type != "adaptive":
            args["enable_thinking"] = self.thinking.type == "enabled"
            if self.thinking.type == "enabled":
                budget = self.thinking.budget_tokens
        return ChatTurn(
            messages=messages,
            tools=[t for t in (function_tool(spec) for spec in self.tools or []) if t],
            tool_choice=ToolChoice(mode[choice.type], choice.name),
            parallel_tool_calls=not choice.disable_parallel_tool_use,
            template_args=args,
            thinking_budget=budget,
            strict_tools=frozenset(t.name for t in self.tools or [] if t.strict),
            **settings,
        )


class MessagesRequest(CountRequest):
    """POST /v1/messages."""

    max_tokens: int = Field(ge=1)
    stream: StrictBool = False
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=0)
    metadata: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None
    """`format` ({type: json_schema, schema}) constrains the answer (structured outputs)."""
    output_format: dict[str, Any] | None = None
    """The structured-outputs beta's spelling of `output_config.format`."""

    def to_generation_turn(self) -> ChatTurn:
        stops = tuple(s for s in self.stop_sequences or [] if s)
        if len(stops) > MAX_STOPS:
            raise APIError(400, f"stop_sequences takes at most {MAX_STOPS}", "stop_sequences")
        return self.to_turn(
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            max_tokens=self.max_tokens,
            stop=stops,
            grammar=anthropic_format(self.output_config, self.output_format),
            grammar_param="output_config.format" if self.output_config else "output_format",
        )


def function_tool(spec: ToolSpec) -> dict[str, Any] | None:
    """A client tool in OpenAI's function shape, as chat templates read it; None for
    Anthropic's server tools (web search, code execution...), which a local model cannot run."""
    if spec.input_schema is None:
        kind = f" ({spec.type})" if spec.type else ""
        log_once(f"tool '{spec.name}'{kind} has no input_schema: not offered to the model")
        return None
    function: dict[str, Any] = {"name": spec.name, "parameters": spec.input_schema}
    if spec.description:
        function["description"] = spec.description
    return {"type": "function", "function": function}


BILLING = "x-anthropic-billing-header:"
"""Claude Code's first system block: billing metadata for Anthropic's servers, not words for
the model; it may change with every request, which would defeat the prompt cache."""


def without_billing(system: str | list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """The system prompt without Claude Code's billing block."""
    if isinstance(system, str):
        return system
    return [b for b in system if not str(b.get("text", "")).startswith(BILLING)]


def text_of(content: str | list[dict[str, Any]] | None, where: str) -> str:
    """The text of a string or of text blocks (a tool result's, the system prompt's)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for i, block in enumerate(content):
        kind = block.get("type")
        if kind == "text":
            parts.append(str(block.get("text", "")))
        else:
            refuse(kind, f"{where}.{i}")
    return "\n\n".join(p for p in parts if p)


def refuse(kind: Any, where: str) -> None:
    if kind in ("image", "document"):
        raise APIError(
            400, f"{where}: {kind}s are not supported: macspec serves text models", where
        )
    raise APIError(400, f"{where}: content blocks of type '{kind}' are not supported here", where)


def translate(message: Message, where: str) -> list[dict[str, Any]]:
    """One Anthropic message -> chat-template messages: tool results become `tool` messages,
    an assistant's tool_use blocks its `tool_calls`, thinking its `reasoning`."""
    if isinstance(message.content, str):
        return [{"role": message.role, "content": message.content}]
    if message.role == "assistant":
        return [assistant_message(message.content, where)]
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    for i, block in enumerate(message.content):
        kind = block.get("type")
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "tool_result" and message.role == "user":
            if texts:
                out.append({"role": message.role, "content": "\n\n".join(texts)})
                texts = []
            content = text_of(block.get("content"), f"{where}.{i}.content")
            if block.get("is_error"):
                content = f"Error: {content}"
            call_id = str(block.get("tool_use_id", ""))
            out.append({"role": "tool", "tool_call_id": call_id, "content": content})
        elif kind not in ("thinking", "redacted_thinking"):
            refuse(kind, f"{where}.{i}")
    if texts or not out:
        out.append({"role": message.role, "content": "\n\n".join(texts)})
    return out


def assistant_message(blocks: list[dict[str, Any]], where: str) -> dict[str, Any]:
    texts, reasoning, calls = [], [], []
    for i, block in enumerate(blocks):
        kind = block.get("type")
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "thinking":
            reasoning.append(str(block.get("thinking", "")))
        elif kind == "tool_use":
            arguments = block.get("input") or {}
            function = {"name": str(block.get("name", "")), "arguments": json.dumps(arguments)}
            calls.append({"id": block.get("id"), "type": "function", "function": function})
        elif kind != "redacted_thinking":  # encrypted: nothing a local model can read
            refuse(kind, f"{where}.{i}")
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if calls:
        message["tool_calls"] = calls
    if reasoning:
        message["reasoning"] = "\n".join(reasoning)
    return message
