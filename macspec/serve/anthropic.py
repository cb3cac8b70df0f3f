"""Anthropic's Messages API: `POST /v1/messages` (streamed as Anthropic's server-sent events,
or whole) and `POST /v1/messages/count_tokens`, with errors in Anthropic's shape.

A stream is `message_start` (with usage, once the engine knows how much of the prompt was
cached), then per content block `content_block_start`, its deltas (`thinking_delta`,
`text_delta`, `input_json_delta`) and `content_block_stop`, then `message_delta` (stop
reason, usage) and `message_stop`; `ping` while the request waits or its prompt is prefilled.
Usage: `input_tokens` (prefilled, not cached) + `cache_read_input_tokens` (from the prompt
cache) + `cache_creation_input_tokens` (prefilled into prompt-cache blocks this request wrote
to disk: what a later prompt sharing them reads) is the prompt, every time, and what
count_tokens says. `message_start` knows only the reads; `message_delta` has all three.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from macspec.engine.core.events import Done, Prefill, Token
from macspec.models.answer_stream import AnswerStream, Call, Piece, Reasoning, Text
from macspec.serve.anthropic_schema import CountRequest, MessagesRequest
from macspec.serve.bodies import parse
from macspec.serve.errors import APIError
from macspec.serve.jobs import answer, log_line
from macspec.serve.render import figures, finished, new_meta
from macspec.serve.served import Served

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}
SIGNATURE = "macspec"
"""Thinking blocks carry a signature clients send back; a local model has nothing to sign."""


def is_anthropic(request: Request) -> bool:
    return request.url.path.startswith("/v1/messages")


def error_response(error: APIError) -> JSONResponse:
    """An error as Anthropic sends it: {"type": "error", "error": {"type", "message"}}."""
    status = error.status
    if error.code == "context_length_exceeded":
        status = 400  # Anthropic says "prompt is too long" with a 400; clients compact on it
    elif status == 503:
        status = 529
    return JSONResponse(error_event_body(status, error.message), status_code=status)


def error_event_body(status: int, message: str) -> dict[str, Any]:
    kind = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def event(name: str, data: dict[str, Any]) -> str:
    """One server-sent event with its `event:` line (the anthropic SDK needs it)."""
    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"event: {name}\ndata: {payload}\n\n"


def stop_reason(done: Done, called: bool) -> str:
    if done.finish_reason in ("length", "context"):
        return "max_tokens"
    if called:
        return "tool_use"
    return "stop_sequence" if done.finish_reason == "stop_string" else "end_turn"


def stop_sequence(done: Done, called: bool) -> str | None:
    """The client's stop sequence that ended the answer; None otherwise (also when the stop was
    a call's end tag, with parallel calls off: the answer ended as a call)."""
    return done.stop_string if stop_reason(done, called) == "stop_sequence" else None


def tool_use_id(raw: str) -> str:
    return raw if raw.startswith("toolu_") else f"toolu_{raw}"


class MessagesRenderer:
    """One generation as an Anthropic message, streamed or whole."""

    def __init__(self, model: str, prompt_tokens: int, answer: AnswerStream, meta):
        self.model = model
        self.prompt_tokens = prompt_tokens
        self.answer = answer
        self.meta = meta
        self.id = f"msg_{uuid.uuid4().hex[:24]}"
        self.block: str | None = None
        """The kind of the content block open in the stream ('text', 'thinking'), if any."""
        self.index = -1

    def usage(self, cached: int, output_tokens: int = 0, created: int = 0) -> dict[str, Any]:
        return {
            "input_tokens": self.prompt_tokens - cached - created,
            "cache_creation_input_tokens": created,
            "cache_read_input_tokens": cached,
            "output_tokens": output_tokens,
        }

    def final_usage(self, done: Done) -> dict[str, Any]:
        """The usage of a finished answer: reads, writes and the rest of the prompt."""
        stats = done.stats
        cached = self.prompt_tokens - stats.prefilled_tokens
        created = min(stats.disk_written_tokens, self.prompt_tokens - cached)
        return self.usage(cached, len(done.tokens) + stats.end_tokens, created)

    def _message(self, content: list, usage: dict, done: Done | None = None) -> dict[str, Any]:
        called = bool(self.answer.calls)
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": stop_reason(done, called) if done is not None else None,
            "stop_sequence": stop_sequence(done, called) if done is not None else None,
            "usage": usage,
        }

    # -- streaming -------------------------------------------------------------------------
    def opening(self) -> list[str]:
        return []

    def prefilled(self, prefill: Prefill) -> list[str]:
        message = self._message([], self.usage(prefill.cached_tokens))
        return [event("message_start", {"type": "message_start", "message": message})]

    def token(self, token: Token) -> list[str]:
        return self._pieces(self.answer.feed(token.text))

    def closing(self, done: Done, queued_s: float) -> list[str]:
        out = self._pieces(self.answer.feed(done.tail) + self.answer.finish())
        out += self._close_block()
        delta = {
            "type": "message_delta",
            "delta": {
                "stop_reason": stop_reason(done, bool(self.answer.calls)),
                "stop_sequence": stop_sequence(done, bool(self.answer.calls)),
            },
            "usage": self.final_usage(done),
            "macspec": figures(self.meta, done, queued_s),
        }
        return [
            *out,
            event("message_delta", delta),
            event("message_stop", {"type": "message_stop"}),
        ]

    def keepalive(self) -> str:
        return event("ping", {"type": "ping"})

    def failed(self, message: str) -> list[str]:
        return [event("error", error_event_body(500, message))]

    def summary(self) -> str:
        calls = len(self.answer.calls)
        return f"{calls} tool call{'s' if calls != 1 else ''}" if calls else ""

    def _pieces(self, pieces: list[Piece]) -> list[str]:
        out: list[str] = []
        for piece in pieces:
            if isinstance(piece, Call):
                out += self._close_block()
                block = self._tool_block(piece)
                self.index += 1
                start = {**block, "input": {}}
                out.append(self._event("content_block_start", content_block=start))
                json_delta = {"type": "input_json_delta", "partial_json": piece.call.arguments_json}
                out.append(self._event("content_block_delta", delta=json_delta))
                out.append(self._event("content_block_stop"))
                continue
            kind = "thinking" if isinstance(piece, Reasoning) else "text"
            if self.block != kind:
                out += self._close_block()
                self.block, self.index = kind, self.index + 1
                empty = {"type": kind, kind: ""}
                if kind == "thinking":
                    empty["signature"] = ""
                out.append(self._event("content_block_start", content_block=empty))
            delta = {"type": f"{kind}_delta", kind: piece.text}
            out.append(self._event("content_block_delta", delta=delta))
        return out

    def _close_block(self) -> list[str]:
        if self.block is None:
            return []
        out = []
        if self.block == "thinking":
            signature = {"type": "signature_delta", "signature": SIGNATURE}
            out.append(self._event("content_block_delta", delta=signature))
        self.block = None
        return [*out, self._event("content_block_stop")]

    def _event(self, name: str, **fields: Any) -> str:
        return event(name, {"type": name, "index": self.index, **fields})

    @staticmethod
    def _tool_block(piece: Call) -> dict[str, Any]:
        call = piece.call
        return {"type": "tool_use", "id": tool_use_id(call.id), "name": call.name}

    def absorb(self, event: Token) -> None:
        self.answer.feed(event.text)

    # -- whole -----------------------------------------------------------------------------
    def whole(self, done: Done, queued_s: float) -> dict[str, Any]:
        finished(self.answer, done)
        content: list[dict[str, Any]] = []
        for piece in merged(self.answer.pieces):
            if isinstance(piece, Reasoning):
                content.append({"type": "thinking", "thinking": piece.text, "signature": SIGNATURE})
            elif isinstance(piece, Text):
                content.append({"type": "text", "text": piece.text})
            else:
                content.append({**self._tool_block(piece), "input": piece.call.arguments})
        return {
            **self._message(content, self.final_usage(done), done),
            "macspec": figures(self.meta, done, queued_s),
        }


def merged(pieces: list[Piece]) -> list[Piece]:
    """Consecutive reasoning or text pieces joined: one content block each."""
    out: list[Piece] = []
    for piece in pieces:
        if out and type(out[-1]) is type(piece) and not isinstance(piece, Call):
            out[-1] = type(piece)(out[-1].text + piece.text)
        else:
            out.append(piece)
    return out


def add_routes(app: FastAPI, models: Served, authorized) -> None:
    """POST /v1/messages and /v1/messages/count_tokens (any query, e.g. ?beta=true)."""

    @app.post("/v1/messages", dependencies=[Depends(authorized)])
    async def messages(request: Request):
        body = await parse(request, MessagesRequest)
        async with models.lease(body.model) as backend:
            prepared = await run_in_threadpool(backend.prepare_turn, body.to_generation_turn())
            meta = new_meta(
                "msg", backend.model_id, len(prepared.prompt), draft=backend.draft, k=backend.k
            )
            renderer = MessagesRenderer(
                body.model, len(prepared.prompt), prepared.answer_stream(), meta
            )
            return await answer(request, backend, prepared, body.stream, renderer)

    @app.post("/v1/messages/count_tokens", dependencies=[Depends(authorized)])
    async def count_tokens(request: Request) -> dict:
        body = await parse(request, CountRequest)
        async with models.lease(body.model) as backend:
            count = await run_in_threadpool(backend.count_tokens, body.to_turn())
        log_line(request, 200, f"{count} tokens")
        return {"input_tokens": count}
