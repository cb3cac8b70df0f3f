"""Request bodies, mirroring OpenAI's schema field for field (as vLLM's entrypoint does).

Pydantic checks types and ranges, so a malformed request gets a 400 naming the field.
Fields OpenAI has and macspec cannot honour (n > 1, logprobs, tools, penalties) are a 400 too,
from `unsupported()`, rather than silently ignored; fields this schema does not know are
ignored, as OpenAI-compatible servers do (clients send vendor extras).
`top_k`, `min_p` and `chat_template_kwargs` are the common extensions (vLLM, mlx-lm).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, model_validator

from macspec.serve.errors import APIError

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


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    @model_validator(mode="after")
    def _content_given(self) -> ChatMessage:
        # Only an assistant turn (one that called tools) may come without content.
        if self.content is None and self.role != "assistant":
            raise ValueError(f"a {self.role} message needs content")
        return self

    def as_template_message(self) -> dict[str, str]:
        """{'role', 'content'} for the chat template ('developer' is OpenAI's new 'system')."""
        content = self.content or ""
        if isinstance(content, list):
            content = "".join(part.text for part in content)
        role = "system" if self.role == "developer" else self.role
        return {"role": role, "content": content}


class ChatCompletionRequest(Request):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    functions: list[Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    """Extra chat template arguments, e.g. {"enable_thinking": false}."""

    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def unsupported(self) -> APIError | None:
        if self.logprobs or self.top_logprobs:
            return APIError(400, "logprobs are not supported", "logprobs")
        if self.tools or self.functions:
            return APIError(400, "tools and function calling are not supported", "tools")
        return super().unsupported()


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
        if not prompt:
            raise APIError(400, "the prompt is empty", "prompt")
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
