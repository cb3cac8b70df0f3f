"""Ollama's REST API requests (`/api/chat`, `/api/generate`), field for field as Ollama's Go
types (`api/types.go`) have them, translated into a ChatTurn.

`options` holds Ollama's Modelfile parameters: temperature, top_p, top_k, min_p, seed,
num_predict (-1: until the context is full, -2: fill the context), stop and num_ctx are
honoured; the others (penalties, mirostat, num_gpu...) are accepted, as Ollama accepts them,
and named once in the log. `format` is "json" or a JSON schema (the answer is held to it by
the engine's grammar). Images are refused: macspec serves text models.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from macspec.engine.core.grammar import Grammar
from macspec.errors import MacspecError
from macspec.serve.errors import APIError
from macspec.serve.notes import log_once
from macspec.serve.turn import ChatTurn

HONOURED = frozenset(
    {"temperature", "top_p", "top_k", "min_p", "seed", "num_predict", "stop", "num_ctx"}
)
UNTIL_FULL = 1 << 30
"""num_predict -1 or -2 with no context limit: the engine stops at EOS (or a stop)."""
IMAGES = "images are not read yet: macspec serves text models; send the request without images"


class Message(BaseModel):
    """One chat message (Ollama's api.Message)."""

    model_config = ConfigDict(extra="ignore")

    role: str
    content: str | None = ""
    thinking: str | None = None
    images: list[Any] | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None

    @field_validator("role")
    @classmethod
    def lower_role(cls, role: str) -> str:
        return role.lower()  # as Ollama's UnmarshalJSON does

    def to_template(self) -> dict[str, Any]:
        """The message as chat templates read it (OpenAI's shape, see ChatTurn)."""
        message: dict[str, Any] = {"role": self.role, "content": self.content or ""}
        if self.thinking and self.role == "assistant":
            message["reasoning"] = self.thinking
        if self.tool_calls and self.role == "assistant":
            message["tool_calls"] = [openai_call(c, i) for i, c in enumerate(self.tool_calls)]
        if self.role == "tool":
            message["tool_call_id"] = self.tool_call_id or ""
            if self.tool_name:
                message["name"] = self.tool_name
        return message


def openai_call(call: dict[str, Any], index: int) -> dict[str, Any]:
    """An Ollama tool call ({function: {name, arguments: {...}}}) in OpenAI's shape."""
    function = call.get("function") or {}
    arguments = function.get("arguments") or {}
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return {
        "id": str(call.get("id") or f"call_{index}"),
        "type": "function",
        "function": {"name": str(function.get("name", "")), "arguments": arguments},
    }


class Request(BaseModel):
    """What /api/chat and /api/generate share."""

    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1)
    stream: bool | None = None
    """Streamed as newline-delimited JSON unless false."""
    format: Any = None
    keep_alive: str | int | float | None = None
    """How long the model stays loaded after this request ('5m', 0: unloaded once answered,
    -1: kept); `macspec serve --model M` keeps its one model loaded whatever it says."""
    options: dict[str, Any] | None = None
    think: bool | str | None = None
    truncate: bool | None = None
    shift: bool | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None

    @property
    def streamed(self) -> bool:
        return self.stream is not False

    def unloads(self) -> bool:
        """keep_alive 0: Ollama unloads the model (the pool does; one --model stays)."""
        return self.keep_alive in (0, "0", "0s", "0m")

    def settings(self) -> dict[str, Any]:
        """The ChatTurn fields the options, format and think give."""
        if self.logprobs:
            log_once("ollama: logprobs are not returned (not implemented)")
        return {
            **options(self.options),
            "grammar": answer_format(self.format),
            "template_args": think_args(self.think),
        }


class ChatRequest(Request):
    """POST /api/chat (Ollama's api.ChatRequest)."""

    messages: list[Message] = Field(default_factory=list)
    tools: list[dict[str, Any]] | None = None

    def to_turn(self) -> ChatTurn:
        for i, message in enumerate(self.messages):
            if message.images:
                raise APIError(400, IMAGES, f"messages.{i}.images")
        tools = self.tools or []
        for i, tool in enumerate(tools):
            function = tool.get("function") if isinstance(tool, dict) else None
            if not isinstance(function, dict) or not function.get("name"):
                raise APIError(400, f"tools.{i}: a tool needs a function with a name", "tools")
        return ChatTurn(
            messages=[m.to_template() for m in self.messages],
            tools=[{**t, "type": t.get("type") or "function"} for t in tools],
            grammar_param="format",
            **self.settings(),
        )


class GenerateRequest(Request):
    """POST /api/generate (Ollama's api.GenerateRequest)."""

    prompt: str = ""
    suffix: str = ""
    system: str = ""
    template: str = ""
    context: list[int] | None = None
    raw: bool = False
    images: list[Any] | None = None

    def to_turn(self) -> ChatTurn:
        """The prompt as one user turn (after `system`); `raw` prompts are not templated and
        use only the settings."""
        if self.images:
            raise APIError(400, IMAGES, "images")
        if self.raw and (self.template or self.system or self.context):
            raise APIError(400, "raw mode does not support template, system, or context")
        if self.template:
            log_once("ollama: 'template' is ignored: prompts use the model's own chat template")
        if self.context:
            log_once("ollama: 'context' (deprecated) is ignored: send the conversation instead")
        messages = [{"role": "system", "content": self.system}] if self.system else []
        messages.append({"role": "user", "content": self.prompt})
        return ChatTurn(
            messages=messages, field_prefix="prompt", grammar_param="format", **self.settings()
        )


THINK_LEVELS = ("low", "medium", "high", "max")


def think_args(think: bool | str | None) -> dict[str, Any]:
    """`think` as chat-template arguments: true/false switch thinking (Qwen3's
    enable_thinking); a level also sets gpt-oss's reasoning_effort ('max' is its 'high')."""
    if think is None:
        return {}
    if isinstance(think, bool):
        return {"enable_thinking": think}
    if think not in THINK_LEVELS:
        raise APIError(
            400,
            f"invalid think value: {json.dumps(think)} (true, false, or one of "
            f"{', '.join(THINK_LEVELS)})",
            "think",
        )
    return {"enable_thinking": True, "reasoning_effort": "high" if think == "max" else think}


def answer_format(value: Any) -> Grammar | None:
    """`format`: "json" (any JSON value), a JSON schema object, or nothing ("" or null)."""
    if value is None or value == "":
        return None
    try:
        if value == "json":
            return Grammar("json")
        if isinstance(value, dict):
            return Grammar.json_schema(value)
    except MacspecError as exc:  # too large
        raise APIError(400, str(exc), "format") from None
    raise APIError(
        400,
        f'invalid format: {json.dumps(value)}; expected "json" or a valid JSON Schema object',
        "format",
    )


def options(given: dict[str, Any] | None) -> dict[str, Any]:
    """Ollama's options as ChatTurn fields; the ones macspec does not honour are named once
    in the log (Ollama too accepts unknown names with a warning)."""
    given = dict(given or {})
    ignored = sorted(k for k, v in given.items() if k not in HONOURED and v is not None)
    if ignored:
        log_once(f"ollama: options not implemented, ignored: {', '.join(ignored)}")
    out: dict[str, Any] = {}
    for name, low, high in (("temperature", 0, 2), ("top_p", 0, 1), ("min_p", 0, 1)):
        if given.get(name) is not None:
            out[name] = number(given[name], name, low, high)
    top_k = given.get("top_k")
    if top_k is not None:
        out["top_k"] = integer(top_k, "top_k", low=0)
    if out.get("top_p") == 0:
        out["top_p"] = 1.0  # Ollama's zero is 'unset', not 'nothing may be sampled'
    seed = given.get("seed")
    if seed is not None and integer(seed, "seed") >= 0:  # Ollama's -1: a random seed
        out["seed"] = int(seed)
    predict = given.get("num_predict")
    if predict is not None:
        predict = integer(predict, "num_predict", low=-2)
        # -1: until EOS or the context is full; -2: fill the context (the same here).
        out["max_tokens"] = predict if predict > 0 else UNTIL_FULL
    num_ctx = given.get("num_ctx")
    if num_ctx is not None:
        out["context_length"] = integer(num_ctx, "num_ctx", low=1)
    stop = given.get("stop")
    if stop is not None:
        stops = [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise APIError(400, "option 'stop' must be a string or a list of strings", "stop")
        out["stop"] = tuple(s for s in stops if s)
    return out


def number(value: Any, name: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise APIError(400, f"option '{name}' must be a number, not {json.dumps(value)}", name)
    if not low <= value <= high:
        raise APIError(400, f"option '{name}' must be between {low} and {high}", name)
    return float(value)


def integer(value: Any, name: str, low: int | None = None) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # JSON numbers from JavaScript clients
    if isinstance(value, bool) or not isinstance(value, int):
        raise APIError(400, f"option '{name}' must be an integer, not {json.dumps(value)}", name)
    if low is not None and value < low:
        raise APIError(400, f"option '{name}' must be at least {low}", name)
    return value
