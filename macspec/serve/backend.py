"""What the server serves: one engine, its tokenizer, its worker, and the server's defaults.

Requests become prompt ids and a GenerationConfig here; anything wrong with them is an
APIError (400, or 413 for a prompt the context cannot hold) before they reach the queue.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from macspec.engine.core.grammar import Constraint, Grammar
from macspec.engine.core.sampling import SamplingParams
from macspec.engine.generate.loop import Engine, GenerationConfig
from macspec.errors import EMPTY_PROMPT, MacspecError, is_empty_prompt
from macspec.models.answer_stream import AnswerStream
from macspec.models.reasoning import reasoning_start
from macspec.models.templates import encode_messages, encode_prompt, has_chat_template
from macspec.models.tools import HARMONY, ToolFormat, template_messages, tool_format
from macspec.serve.budget import ThinkingBudget
from macspec.serve.errors import APIError
from macspec.serve.model_names import accepted_names
from macspec.serve.schema import CompletionRequest
from macspec.serve.tool_grammar import forced_call_grammar
from macspec.serve.turn import ChatTurn
from macspec.serve.worker import Worker

if TYPE_CHECKING:
    from macspec.serve.ranks import Leader

log = logging.getLogger("macspec.serve")


@dataclass
class Defaults:
    """The server's settings for what a request leaves out (the command's flags)."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    max_tokens: int = 512
    """Tokens to generate when a request does not say (the room left in the context caps it)."""
    template_args: dict[str, Any] = field(default_factory=dict)
    """Chat template arguments (--think, --chat-template-args); a request's own extend them."""
    stop: tuple[str, ...] = ()
    """Stop strings for a request that gives none (an Ollama model's params: its template's
    end-of-turn text, where the model's own end token does not end a turn)."""
    seed: int | None = None
    """The seed of a request that gives none (an Ollama model's params)."""


@dataclass(frozen=True)
class Prepared:
    """A request, ready for the queue."""

    prompt: list[int]
    config: GenerationConfig
    reasoning_start: bool | None
    """How the answer starts: inside a <think> block, outside; None: no think tags."""
    tool_format: ToolFormat | None = None
    """The model's tool-call format, when the answer is parsed for calls (else None)."""
    tools: list[dict[str, Any]] | None = None
    """The request's tools, for the parsers that read their schemas."""
    forced: str = ""
    """Text the prompt ends with to open a call (tool_choice 'required' or a named one)."""
    parallel_tool_calls: bool = True
    thinking_budget: ThinkingBudget | None = None
    """At most this much reasoning (a model with think tags, when the request set one)."""

    calls_as_text: bool = False
    """tool_choice 'none' with tools: a call the model makes anyway is text, tags dropped."""

    def answer_stream(self) -> AnswerStream:
        """A fresh parser for this request's answer: reasoning, text and tool calls apart."""
        tools = self.tools if self.tool_format is not None else None
        return AnswerStream(
            self.reasoning_start, self.tool_format, tools, self.forced, self.calls_as_text
        )


class Backend:
    """One loaded model pair behind the API."""

    def __init__(
        self,
        engine: Engine,
        tokenizer,
        model_id: str,
        context_length: int | None = None,
        defaults: Defaults | None = None,
        aliases: tuple[str, ...] = (),
        k: str | int | None = None,
        max_queue: int = 32,
        prompt_cache_size: int = 4,
        leader: Leader | None = None,
        any_model: bool = False,
        max_batch: int = 1,
    ):
        self.engine = engine
        self.tokenizer = tokenizer
        self.model_id = model_id
        """The id /v1/models lists; requests must name it (or an alias)."""
        self.aliases = accepted_names(model_id, aliases)
        """Every name any route lists or was given, tagged and not: each route accepts each."""
        self.context_length = context_length
        """Tokens the model attends to (prompt + answer); None: no limit enforced."""
        self.defaults = defaults if defaults is not None else Defaults()
        self.draft = engine.drafter.name if engine.drafter is not None else None
        self.k = k if engine.drafter is not None else None
        if max_batch > 1:
            from macspec.serve.batch_worker import BatchWorker

            self.worker: Worker = BatchWorker(engine, max_batch, max_queue, prompt_cache_size)
        else:
            self.worker = Worker(engine, max_queue, prompt_cache_size, leader)
        self.max_batch = max_batch
        self.vocab_size = len(tokenizer.get_vocab())
        """Ids a /v1/completions prompt may hold."""
        self._tokenizer_lock = threading.Lock()
        """Encoding runs on request threads; one at a time (the worker only decodes)."""
        self._grammar_lock = threading.Lock()
        self.tool_format = tool_format(tokenizer)
        """How the model writes tool calls; None: it cannot call tools."""
        self.any_model = any_model
        """Answer every model id with this pair (agents send their own ids)."""
        self._seen_ids: set[str] = set()

    def check_model(self, name: str) -> None:
        if name in self.aliases:
            return
        if self.any_model:
            if name not in self._seen_ids:  # once per id: agents send one with every request
                self._seen_ids.add(name)
                log.info("model '%s' requested: answered by %s (--any-model)", name, self.model_id)
            return
        raise APIError(
            404,
            f"The model '{name}' does not exist; this server serves '{self.model_id}' "
            "(--any-model answers every id)",
            "model",
            "model_not_found",
        )

    # -- requests to prompts -------------------------------------------------------------
    def prepare_turn(self, turn: ChatTurn) -> Prepared:
        """A chat request of any protocol -> prompt ids (the model's own template, tools
        included) and the generation's settings; a 400 for what cannot be honoured."""
        self._check_grammar(turn)
        prompt, start, fmt, forced = self.render_turn(turn)
        stops = turn.stop
        if fmt is not None and not turn.parallel_tool_calls and fmt.end:
            stops = (*stops, fmt.end)  # one call: the answer ends where it does
        grammar = turn.grammar
        if fmt is not None and turn.tool_choice.mode in ("required", "function"):
            grammar = self._call_grammar(turn, fmt)
            if grammar is not None:
                self._compile(grammar, "tools")
        config = self._config(turn, len(prompt), stops, grammar)
        tools = turn.tools if fmt is not None else None
        budget = None
        if turn.thinking_budget is not None and start is not None and not forced:
            budget = ThinkingBudget(turn.thinking_budget, inside=start)
        as_text = fmt is None and bool(turn.tools) and turn.tool_choice.mode == "none"
        if as_text:
            fmt = self.tool_format  # the model's calls, if it makes any, are parsed as text
        return Prepared(
            prompt, config, start, fmt, tools, forced, turn.parallel_tool_calls, budget, as_text
        )

    def render_turn(self, turn: ChatTurn) -> tuple[list[int], bool | None, ToolFormat | None, str]:
        """(prompt ids, reasoning start, the tool format calls are parsed with, the forced
        opening of a call) for a conversation."""
        fmt = self._check_tools(turn)
        args = {**self.defaults.template_args, **turn.template_args}
        tools = turn.tools if turn.tool_choice.mode != "none" else None
        with self._tokenizer_lock:
            prompt = self._render(turn, args, tools)
            start = reasoning_start(self.tokenizer, prompt)
            forced = ""
            if fmt is not None and turn.tool_choice.mode in ("required", "function"):
                # A strict tool's call is written by its grammar; else the prompt opens it.
                forced = "" if self._call_grammar(turn, fmt) else fmt.opening(turn.tool_choice.name)
                # A prompt that opens the reasoning closes it first: the answer is the call.
                close = "\n</think>\n\n" if start and fmt is not HARMONY else ""
                prompt += self.tokenizer.encode(close + forced, add_special_tokens=False)
                start = False if close else start
            elif turn.grammar is not None and start and self.tool_format is not HARMONY:
                # The grammar holds from the answer's first token: its reasoning is closed.
                prompt += self.tokenizer.encode("\n</think>\n\n", add_special_tokens=False)
                start = False
        return prompt, start, fmt, forced

    def _check_grammar(self, turn: ChatTurn) -> None:
        """A 400 for a structured output format this server cannot hold the answer to: one
        llguidance cannot compile (with its reason), or one asked for alongside tools."""
        if turn.grammar is None:
            return
        if turn.calls_tools:
            raise APIError(
                400,
                f"{turn.grammar_param} together with tools is not supported: send tool_choice "
                "'none', or the request without tools",
                turn.grammar_param,
            )
        self._compile(turn.grammar, turn.grammar_param)

    def _compile(self, grammar: Grammar, param: str) -> None:
        """A 400 naming `param`, with llguidance's reason, for a grammar it cannot compile."""
        with self._grammar_lock:  # the first compile builds llguidance's tokenizer, once
            try:
                Constraint(grammar, self.tokenizer)
            except MacspecError as exc:
                raise APIError(400, str(exc), param) from None

    def _call_grammar(self, turn: ChatTurn, fmt: ToolFormat) -> Grammar | None:
        """The grammar of a forced call to strict tools (None: not strict, or a format the
        grammar cannot write)."""
        name = turn.tool_choice.name if turn.tool_choice.mode == "function" else None
        return forced_call_grammar(fmt, self.tokenizer, turn.tools, name, turn.strict_tools)

    def count_tokens(self, turn: ChatTurn) -> int:
        """Ids a request with this conversation would put in the prompt (however long)."""
        return len(self.render_turn(turn)[0])

    def _check_tools(self, turn: ChatTurn) -> ToolFormat | None:
        """The tool format the answer is parsed with (None: none); a 400 for tools this model
        cannot call, or a tool_choice naming a tool the request does not have."""
        if not turn.calls_tools:
            if turn.tool_choice.mode in ("required", "function"):
                raise APIError(
                    400, "tool_choice asks for a call, but no function tool was sent", "tools"
                )
            return None
        if self.tool_format is None:
            raise APIError(
                400,
                f"{self.model_id} has no tool-call format macspec can parse (its chat template "
                "names none that mlx-lm knows): send the request without tools",
                "tools",
            )
        name = turn.tool_choice.name
        names = {(t.get("function") or {}).get("name") for t in turn.tools}
        if turn.tool_choice.mode == "function" and name not in names:
            raise APIError(400, f"tool_choice names '{name}', which is not in tools", "tool_choice")
        return self.tool_format

    def _render(self, turn: ChatTurn, args: dict, tools: list | None) -> list[int]:
        if not has_chat_template(self.tokenizer):
            raise APIError(
                400, "this model has no chat template: use /v1/completions", turn.field_prefix
            )
        messages = template_messages(self.tokenizer, turn.messages)
        try:
            return encode_messages(self.tokenizer, messages, args, tools)
        except Exception as first:  # the template's own checks (roles, alternation)
            merged = merge_system_messages(messages)
            if merged != messages:  # a system message mid-conversation: at the front instead
                try:
                    return encode_messages(self.tokenizer, merged, args, tools)
                except Exception:
                    pass
            text = str(first).strip()
            reason = text.splitlines()[0] if text else repr(first)
            raise APIError(
                400, f"the chat template refused the messages: {reason}", turn.field_prefix
            ) from None

    def _encode_raw(self, text: str) -> list[int]:
        """A raw prompt's ids; a 400 for text that encodes to none (whitespace a tokenizer
        drops), which the engine could not start from."""
        with self._tokenizer_lock:
            ids = encode_prompt(self.tokenizer, text, raw=True)
        if is_empty_prompt(ids):
            raise APIError(400, f"{EMPTY_PROMPT}: its text encodes to no ids", "prompt")
        return ids

    def prepare_text(self, text: str, turn: ChatTurn) -> Prepared:
        """A prompt taken as it is (no template; Ollama's raw generate), with the settings
        and the answer's grammar of `turn`."""
        ids = self._encode_raw(text)
        if turn.grammar is not None:
            self._compile(turn.grammar, turn.grammar_param)
        config = self._config(turn, len(ids), turn.stop, turn.grammar)
        return Prepared(ids, replace(config, continuation=True), None)

    def prepare_completion(self, request: CompletionRequest) -> Prepared:
        prompt = request.single_prompt()
        if isinstance(prompt, str):
            ids = self._encode_raw(prompt)
        else:
            vocab = self.vocab_size
            if any(not 0 <= i < vocab for i in prompt):
                raise APIError(400, f"token ids must be in 0..{vocab - 1}", "prompt")
            ids = list(prompt)
        problem = request.unsupported()
        if problem is not None:
            raise problem
        settings = ChatTurn(
            messages=[],
            temperature=request.temperature,
            top_p=request.top_p,
            top_k=request.top_k,
            min_p=request.min_p,
            max_tokens=request.token_limit(),
            stop=request.stop_strings(),
            seed=request.seed,
            field_prefix="prompt",
        )
        config = self._config(settings, len(ids), settings.stop)
        return Prepared(ids, replace(config, continuation=True), None)

    def _config(
        self,
        turn: ChatTurn,
        prompt_tokens: int,
        stops: tuple[str, ...],
        grammar: Grammar | None = None,
    ) -> GenerationConfig:
        wanted = turn.max_tokens
        max_tokens = wanted if wanted is not None else self.defaults.max_tokens
        context = self.context_length
        if turn.context_length is not None:
            context = min(context or turn.context_length, turn.context_length)
        if context is not None and context - prompt_tokens < 1:
            raise APIError(
                413,
                f"prompt is too long: {prompt_tokens} tokens > {context - 1} maximum "
                f"({'the model' if context == self.context_length else 'the request'}'s context "
                f"holds {context}): shorten it",
                turn.field_prefix,
                "context_length_exceeded",
            )
        d = self.defaults
        try:
            sampling = SamplingParams(
                temperature=d.temperature if turn.temperature is None else turn.temperature,
                top_p=d.top_p if turn.top_p is None else turn.top_p,
                top_k=d.top_k if turn.top_k is None else turn.top_k,
                min_p=d.min_p if turn.min_p is None else turn.min_p,
            )
            # The engine cuts max_tokens to the room the context leaves, and then says the
            # answer ended at the 'context', not at 'length'.
            return GenerationConfig(
                max_tokens=max_tokens,
                sampling=sampling,
                stop_strings=stops or d.stop,
                seed=d.seed if turn.seed is None else turn.seed,
                context_length=context,
                grammar=grammar,
            )
        except MacspecError as exc:  # the schema checks ranges; this is a safety net
            raise APIError(400, str(exc)) from None


def merge_system_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every system message's text in one system message at the front (for templates that
    accept a system message only there; agents send them mid-conversation too)."""
    system = [m for m in messages if m.get("role") == "system"]
    if not system:
        return messages
    text = "\n\n".join(str(m.get("content") or "") for m in system)
    return [
        {"role": "system", "content": text},
        *(m for m in messages if m.get("role") != "system"),
    ]
