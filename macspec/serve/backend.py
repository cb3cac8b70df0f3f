"""What the server serves: one engine, its tokenizer, its worker, and the server's defaults.

Requests become prompt ids and a GenerationConfig here; anything wrong with them is an
APIError (400, or 413 for a prompt the context cannot hold) before they reach the queue.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from macspec.engine.loop import Engine, GenerationConfig
from macspec.engine.sampling import SamplingParams
from macspec.errors import MacspecError
from macspec.models.reasoning import reasoning_start
from macspec.models.templates import encode_messages, encode_prompt, has_chat_template
from macspec.serve.errors import APIError
from macspec.serve.schema import ChatCompletionRequest, CompletionRequest, Request
from macspec.serve.worker import Worker

if TYPE_CHECKING:
    from macspec.serve.ranks import Leader


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


@dataclass(frozen=True)
class Prepared:
    """A request, ready for the queue."""

    prompt: list[int]
    config: GenerationConfig
    reasoning_start: bool | None
    """How the answer starts: inside a <think> block, outside; None: no think tags."""


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
    ):
        self.engine = engine
        self.tokenizer = tokenizer
        self.model_id = model_id
        """The id /v1/models lists; requests must name it (or an alias)."""
        self.aliases = frozenset((model_id, *aliases))
        self.context_length = context_length
        """Tokens the model attends to (prompt + answer); None: no limit enforced."""
        self.defaults = defaults if defaults is not None else Defaults()
        self.draft = engine.drafter.name if engine.drafter is not None else None
        self.k = k if engine.drafter is not None else None
        self.worker = Worker(engine, max_queue, prompt_cache_size, leader)
        self.vocab_size = len(tokenizer.get_vocab())
        """Ids a /v1/completions prompt may hold."""
        self._tokenizer_lock = threading.Lock()
        """Encoding runs on request threads; one at a time (the worker only decodes)."""

    def check_model(self, name: str) -> None:
        if name not in self.aliases:
            raise APIError(
                404,
                f"The model '{name}' does not exist; this server serves '{self.model_id}'",
                "model",
                "model_not_found",
            )

    # -- requests to prompts -------------------------------------------------------------
    def prepare_chat(self, request: ChatCompletionRequest) -> Prepared:
        messages = [m.as_template_message() for m in request.messages]
        args = {**self.defaults.template_args, **(request.chat_template_kwargs or {})}
        with self._tokenizer_lock:
            if not has_chat_template(self.tokenizer):
                raise APIError(
                    400,
                    "this model has no chat template: use /v1/completions",
                    "messages",
                )
            try:
                prompt = encode_messages(self.tokenizer, messages, args)
            except Exception as exc:  # the template's own checks (roles, alternation)
                reason = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
                raise APIError(
                    400, f"the chat template refused the messages: {reason}", "messages"
                ) from None
            start = reasoning_start(self.tokenizer, prompt)
        return Prepared(prompt, self._config(request, len(prompt)), start)

    def prepare_completion(self, request: CompletionRequest) -> Prepared:
        prompt = request.single_prompt()
        if isinstance(prompt, str):
            with self._tokenizer_lock:
                ids = encode_prompt(self.tokenizer, prompt, raw=True)
        else:
            vocab = self.vocab_size
            if any(not 0 <= i < vocab for i in prompt):
                raise APIError(400, f"token ids must be in 0..{vocab - 1}", "prompt")
            ids = list(prompt)
        return Prepared(ids, self._config(request, len(ids)), None)

    def _config(self, request: Request, prompt_tokens: int) -> GenerationConfig:
        problem = request.unsupported()
        if problem is not None:
            raise problem
        wanted = request.token_limit()
        max_tokens = wanted if wanted is not None else self.defaults.max_tokens
        if self.context_length is not None:
            room = self.context_length - prompt_tokens
            if room < 1:
                raise APIError(
                    413,
                    f"the prompt is {prompt_tokens} tokens and the model's context holds "
                    f"{self.context_length}: shorten it",
                    "messages" if isinstance(request, ChatCompletionRequest) else "prompt",
                    "context_length_exceeded",
                )
            max_tokens = min(max_tokens, room)
        d = self.defaults
        try:
            sampling = SamplingParams(
                temperature=d.temperature if request.temperature is None else request.temperature,
                top_p=d.top_p if request.top_p is None else request.top_p,
                top_k=d.top_k if request.top_k is None else request.top_k,
                min_p=d.min_p if request.min_p is None else request.min_p,
            )
            return GenerationConfig(
                max_tokens=max_tokens,
                sampling=sampling,
                stop_strings=request.stop_strings(),
                seed=request.seed,
            )
        except MacspecError as exc:  # the schema checks ranges; this is a safety net
            raise APIError(400, str(exc)) from None
