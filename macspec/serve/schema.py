"""Request bodies, mirroring OpenAI's schema field for field (as vLLM's entrypoint does).

Pydantic checks types and ranges, so a malformed request gets a 400 naming the field.
Fields OpenAI has and macspec cannot honour (n > 1, logprobs, penalties) are a 400 too,
from `unsupported()`, rather than silently ignored; fields this schema does not know are
ignored, as OpenAI-compatible servers do (clients send vendor extras).
`top_k`, `min_p` and `chat_template_kwargs` are the common extensions (vLLM, mlx-lm).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, model_validator

from macspec.errors import EMPTY_PROMPT, is_empty_prompt
from macspec.serve.errors import APIError
from macspec.serve.formats import chat_format
from macspec.serve.turn import ChatTurn, ToolChoice

MAX_STOPS = 16


class Request(BaseModel):
    """Fields shared by /v1/chat/completions and /v1/completions."""

    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1)
    stream: StrictBool = False  # "yes" or 1 is a 400, as at OpenAI, not read as true
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=0)
    min_p: float | None = Field(default=None, ge=0, lt=1)
    max_tokens: int | None = Field(default=None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int | None = Field(default=None, ge=1)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    user: str | None = None

    def stop_strings(self) -> tuple[str, ...]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return tuple(s for s in stops if s)

    def unsupported(self) -> APIError | None:
        """The first field set to something macspec cannot do, as a 400."""
        if self.n not in (None, 1):
            return APIError(400, "n must be 1: macspec generates one choice", "n")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name):
                return APIError(400, f"{name} is not supported (only 0)", name)
        if isinstance(self.stop, list) and len(self.stop) > MAX_STOPS:
            return APIError(400, f"stop takes at most {MAX_STOPS} strings", "stop")
        if self.stream_options is not None and not self.stream:
            return APIError(400, "stream_options is only allowed with stream: true", "stream")
        return None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")

    include_usage: StrictBool = False
    """Send a last chunk with `usage` (and `usage: null` in every chunk before it)."""


class TextPart(BaseModel):
    """A content part of a message; only text (no images, no audio)."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["text"]
    text: str


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str
    arguments: str | dict[str, Any] = "{}"
    """A JSON string, as OpenAI sends it (an object is taken too)."""


class ToolCallIn(BaseModel):
    """An assistant's earlier call, in the history."""

    model_config = ConfigDict(extra="ignore")

    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    """An assistant's earlier reasoning, as this server sends it (and some clients return)."""

    @model_validator(mode="after")
    def _content_given(self) -> ChatMessage:
        # Only an assistant turn (one that called tools) may come without content.
        if self.content is None and self.role != "assistant":
            raise ValueError(f"a {self.role} message needs content")
        return self

    def as_template_message(self) -> dict[str, Any]:
        """The message for the chat template ('developer' is OpenAI's new 'system')."""
        content = self.content or ""
        if isinstance(content, list):
            content = "".join(part.text for part in content)
        role = "system" if self.role == "developer" else self.role
        message: dict[str, Any] = {"role": role, "content": content}
        if self.tool_calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function", "function": c.function.model_dump()}
                for c in self.tool_calls
            ]
        if self.role == "tool":
            message["tool_call_id"] = self.tool_call_id
            if self.name:
                message["name"] = self.name
        if self.reasoning_content:
            message["reasoning"] = self.reasoning_content
        return message


class FunctionSpec(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["function"]
    function: FunctionSpec

    def for_template(self) -> dict[str, Any]:
        spec = self.function.model_dump(exclude_none=True, exclude={"strict"})
        spec.setdefault("parameters", {"type": "object", "properties": {}})
        return {"type": "function", "function": spec}


class NamedFunction(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["function"]
    function: NamedFunction


class ChatCompletionRequest(Request):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Tool] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    functions: list[Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    """Extra chat template arguments, e.g. {"enable_thinking": false}."""
    response_format: dict[str, Any] | None = None

    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def unsupported(self) -> APIError | None:
        if self.logprobs or self.top_logprobs:
            return APIError(400, "logprobs are not supported", "logprobs")
        if self.functions:
            return APIError(
                400, "the legacy 'functions' are not supported: send 'tools'", "functions"
            )
        return super().unsupported()

    def to_turn(self) -> ChatTurn:
        problem = self.unsupported()
        if problem is not None:
            raise problem
        choice = self.tool_choice
        if isinstance(choice, NamedToolChoice):
            tool_choice = ToolChoice("function", choice.function.name)
        else:
            tool_choice = ToolChoice(choice or "auto")
        return ChatTurn(
            messages=[m.as_template_message() for m in self.messages],
            tools=[t.for_template() for t in self.tools or []],
            tool_choice=tool_choice,
            parallel_tool_calls=self.parallel_tool_calls is not False,
            template_args=dict(self.chat_template_kwargs or {}),
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
            max_tokens=self.token_limit(),
            stop=self.stop_strings(),
            seed=self.seed,
            grammar=chat_format(self.response_format),
            strict_tools=frozenset(t.function.name for t in self.tools or [] if t.function.strict),
        )


class CompletionRequest(Request):
    """POST /v1/completions (legacy text completion): the prompt is fed as is."""

    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = Field(default=None, ge=1)

    def token_limit(self) -> int | None:
        return self.max_tokens

    def single_prompt(self) -> str | list[int]:
        """The one prompt, as text or ids; a 400 for a batch of several."""
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise APIError(400, "one prompt per request: send a string", "prompt")
            prompt = prompt[0]
        if is_empty_prompt(prompt):  # whitespace is content, as OpenAI takes it
            raise APIError(400, EMPTY_PROMPT, "prompt")
        return prompt

    def unsupported(self) -> APIError | None:
        if self.logprobs:
            return APIError(400, "logprobs are not supported", "logprobs")
        if self.echo:
            return APIError(400, "echo is not supported", "echo")
        if self.suffix:
            return APIError(400, "suffix is not supported", "suffix")
        if self.best_of not in (None, 1):
            return APIError(400, "best_of must be 1", "best_of")
        return super().unsupported()


Request.model_rebuild()
ChatCompletionRequest.model_rebuild()
CompletionRequest.model_rebuild()
