"""One chat request in the server's own terms, whatever protocol it came in.

Each protocol adapter (OpenAI chat completions, OpenAI Responses, Anthropic Messages)
translates its schema into a `ChatTurn`; the backend renders it with the model's chat template
and its tool format, and the same engine events go back through each adapter's renderer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from macspec.engine.core.grammar import Grammar

ChoiceMode = Literal["auto", "none", "required", "function"]


@dataclass(frozen=True)
class ToolChoice:
    """Whether and which tool the answer must call."""

    mode: ChoiceMode = "auto"
    """'auto': the model decides; 'none': it answers in text (the tools are not shown to it);
    'required': it calls some tool; 'function': it calls `name`."""
    name: str | None = None


@dataclass
class ChatTurn:
    """A conversation to answer, with its tools and settings."""

    messages: list[dict[str, Any]]
    """Chat-template messages: role ('system', 'user', 'assistant', 'tool'), content (text),
    and for assistants `tool_calls` (OpenAI's shape) and `reasoning` (earlier thinking); for
    tool results `tool_call_id` and `name`."""
    tools: list[dict[str, Any]] = field(default_factory=list)
    """Function tools in OpenAI's shape ({'type': 'function', 'function': {name, description,
    parameters}}), as chat templates read them."""
    tool_choice: ToolChoice = ToolChoice()
    parallel_tool_calls: bool = True
    """False: at most one call per answer."""
    template_args: dict[str, Any] = field(default_factory=dict)
    """The request's own chat-template arguments (e.g. enable_thinking)."""
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    max_tokens: int | None = None
    """None: the server's default. Clamped to the room the context window leaves."""
    stop: tuple[str, ...] = ()
    seed: int | None = None
    context_length: int | None = None
    """Tokens this request may fill (prompt + answer), within the server's window (Ollama's
    num_ctx); None: the server's."""
    thinking_budget: int | None = None
    """Most tokens of reasoning before the answer (None: no limit)."""
    field_prefix: str = "messages"
    grammar: Grammar | None = None
    """What the answer must match (the request's structured output format); None: free."""
    grammar_param: str = "response_format"
    strict_tools: frozenset[str] = frozenset()
    """Tools marked strict: a forced call to them has its arguments held to their parameters."""
    """The request's field that asked for it, for error messages."""
    """The request's field holding the conversation, for error messages ('input' in Responses)."""

    @property
    def calls_tools(self) -> bool:
        """Whether the answer is parsed for tool calls."""
        return bool(self.tools) and self.tool_choice.mode != "none"
