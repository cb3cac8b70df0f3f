"""OpenAI's Responses API, `POST /v1/responses`, as Codex CLI uses it: stateless (the whole
conversation in `input`), function tools, streamed with its events.

A stream is `response.created`, `response.in_progress`, then per output item
`response.output_item.added`, its parts and deltas (`response.reasoning_text.delta`,
`response.content_part.added` / `response.output_text.delta` / `.done` /
`response.content_part.done`, `response.function_call_arguments.delta` / `.done`) and
`response.output_item.done`; then `response.completed` (or `response.incomplete` when the
answer was cut at `max_output_tokens` or the context window), with usage. The last few
responses are kept in memory, so `previous_response_id` can name one of them.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import OrderedDict
from typing import Any

from fastapi import Depends, FastAPI, Request
from starlette.concurrency import run_in_threadpool

from macspec.engine.core.events import Done, Prefill, Token
from macspec.models.answer_stream import AnswerStream, Call, Piece, Reasoning
from macspec.serve.backend import Backend
from macspec.serve.bodies import parse
from macspec.serve.errors import APIError, error_body
from macspec.serve.jobs import answer
from macspec.serve.render import figures, new_meta
from macspec.serve.responses_schema import ResponsesRequest, namespaces
from macspec.serve.served import Served

KEPT_RESPONSES = 32
"""Responses kept in memory for `previous_response_id`."""


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


class Kept:
    """The latest responses' conversations (input and output), by response id."""

    def __init__(self, size: int = KEPT_RESPONSES):
        self.size = size
        self.conversations: OrderedDict[str, list[dict[str, Any]]] = OrderedDict()

    def get(self, response_id: str) -> list[dict[str, Any]]:
        if response_id not in self.conversations:
            raise APIError(
                400,
                f"previous_response_id '{response_id}' is not one this server kept (it keeps "
                f"the last {self.size} while it runs): send the whole conversation in input",
                "previous_response_id",
                "previous_response_not_found",
            )
        self.conversations.move_to_end(response_id)
        return list(self.conversations[response_id])

    def add(self, response_id: str, messages: list[dict[str, Any]]) -> None:
        self.conversations[response_id] = messages
        while len(self.conversations) > self.size:
            self.conversations.popitem(last=False)


class ResponseRenderer:
    """One generation as a Responses API response, streamed or whole."""

    def __init__(self, body: ResponsesRequest, prompt_tokens: int, answer: AnswerStream, meta):
        self.body = body
        self.prompt_tokens = prompt_tokens
        self.answer = answer
        self.meta = meta
        self.id = new_id("resp")
        self.created = int(time.time())
        self.sequence = 0
        self.items: list[dict[str, Any]] = []
        """Output items so far (the open one last, while streaming)."""
        self.open: str | None = None
        """The kind of the item being streamed ('reasoning', 'message'), if any."""
        self.on_done = None
        """Called with the finished output items (the server keeps the conversation)."""
        self.namespaces = namespaces(body.tools)

    def response(self, status: str, done: Done | None = None) -> dict[str, Any]:
        body = self.body
        out = {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "model": body.model,
            "output": self.items,
            "parallel_tool_calls": body.parallel_tool_calls is not False,
            "tool_choice": _dump(body.tool_choice) or "auto",
            "tools": body.tools or [],
            "temperature": body.temperature,
            "top_p": body.top_p,
            "max_output_tokens": body.max_output_tokens,
            "previous_response_id": body.previous_response_id,
            "instructions": body.instructions,
            "reasoning": _dump(body.reasoning),
            "metadata": body.metadata or {},
            "text": {"format": ((body.text or {}).get("format") or {"type": "text"})},
            "truncation": "disabled",
            "error": None,
            "incomplete_details": None,
            "usage": None,
        }
        if done is not None:
            out["usage"] = self.usage(done)
            out["macspec"] = figures(self.meta, done, 0.0)
            if status == "incomplete":
                out["incomplete_details"] = {"reason": "max_output_tokens"}
        return out

    def usage(self, done: Done) -> dict[str, Any]:
        cached = self.prompt_tokens - done.stats.prefilled_tokens
        written = min(done.stats.disk_written_tokens, done.stats.prefilled_tokens)
        output = len(done.tokens) + done.stats.end_tokens
        reasoning = self.answer.reasoning_tokens
        details = {"cached_tokens": cached, "cache_write_tokens": written}
        return {
            "input_tokens": self.prompt_tokens,
            "input_tokens_details": details,
            "output_tokens": output,
            "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": self.prompt_tokens + output,
        }

    # -- streaming -------------------------------------------------------------------------
    def _event(self, kind: str, **fields: Any) -> str:
        self.sequence += 1
        data = {"type": kind, "sequence_number": self.sequence - 1, **fields}
        payload = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
        return f"event: {kind}\ndata: {payload}\n\n"

    def opening(self) -> list[str]:
        start = self.response("in_progress")
        return [
            self._event("response.created", response=start),
            self._event("response.in_progress", response=start),
        ]

    def prefilled(self, event: Prefill) -> list[str]:
        return []

    def token(self, event: Token) -> list[str]:
        return self._pieces(self.answer.feed(event.text))

    def closing(self, done: Done, queued_s: float) -> list[str]:
        out = self._pieces(self.answer.feed(done.tail) + self.answer.finish())
        status = status_of(done)
        # A cancelled answer's message is cut ('incomplete'); no stream event says cancelled.
        cut = "incomplete" if status == "cancelled" else status
        out += self._close(cut)
        final = self.response(status, done)
        final["macspec"] = figures(self.meta, done, queued_s)
        self._kept()
        return [*out, self._event(f"response.{cut}", response=final)]

    def keepalive(self) -> str:
        return ": keep-alive\n\n"

    def failed(self, message: str) -> list[str]:
        failed = self.response("failed")
        failed["error"] = {"code": "server_error", "message": message}
        return [self._event("response.failed", response=failed)]

    def summary(self) -> str:
        calls = len(self.answer.calls)
        return f"{calls} tool call{'s' if calls != 1 else ''}" if calls else ""

    def _pieces(self, pieces: list[Piece]) -> list[str]:
        out: list[str] = []
        for piece in pieces:
            if isinstance(piece, Call):
                out += self._close()
                out += self._call(piece)
                continue
            kind = "reasoning" if isinstance(piece, Reasoning) else "message"
            if self.open != kind:
                out += self._close()
                out += self._open(kind)
            index, item = len(self.items) - 1, self.items[-1]
            if kind == "reasoning":
                item["content"][0]["text"] += piece.text
                out.append(
                    self._event(
                        "response.reasoning_text.delta",
                        item_id=item["id"],
                        output_index=index,
                        content_index=0,
                        delta=piece.text,
                    )
                )
            else:
                item["content"][0]["text"] += piece.text
                out.append(
                    self._event(
                        "response.output_text.delta",
                        item_id=item["id"],
                        output_index=index,
                        content_index=0,
                        delta=piece.text,
                        logprobs=[],
                    )
                )
        return out

    def _open(self, kind: str) -> list[str]:
        self.open = kind
        if kind == "reasoning":
            item = {"type": "reasoning", "id": new_id("rs"), "summary": [], "content": []}
            part = {"type": "reasoning_text", "text": ""}
        else:
            item = {
                "type": "message",
                "id": new_id("msg"),
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            }
            part = {"type": "output_text", "text": "", "annotations": []}
        self.items.append(item)
        index = len(self.items) - 1
        out = [self._event("response.output_item.added", output_index=index, item=_copy(item))]
        item["content"].append(part)
        if kind == "message":
            out.append(
                self._event(
                    "response.content_part.added",
                    item_id=item["id"],
                    output_index=index,
                    content_index=0,
                    part={**part},
                )
            )
        return out

    def _close(self, status: str = "completed") -> list[str]:
        """End the open item: a message cut by the token limit is 'incomplete', as its
        response is."""
        if self.open is None:
            return []
        kind, self.open = self.open, None
        index, item = len(self.items) - 1, self.items[-1]
        part = item["content"][0]
        ids = {"item_id": item["id"], "output_index": index, "content_index": 0}
        if kind == "reasoning":
            out = [self._event("response.reasoning_text.done", **ids, text=part["text"])]
        else:
            item["status"] = status
            out = [
                self._event("response.output_text.done", **ids, text=part["text"], logprobs=[]),
                self._event("response.content_part.done", **ids, part=_copy(part)),
            ]
        out.append(self._event("response.output_item.done", output_index=index, item=_copy(item)))
        return out

    def _call(self, piece: Call) -> list[str]:
        item = self._call_item(piece)
        self.items.append(item)
        index = len(self.items) - 1
        added = {**item, "arguments": "", "status": "in_progress"}
        ids = {"item_id": item["id"], "output_index": index}
        arguments = item["arguments"]
        return [
            self._event("response.output_item.added", output_index=index, item=added),
            self._event("response.function_call_arguments.delta", **ids, delta=arguments),
            self._event("response.function_call_arguments.done", **ids, arguments=arguments),
            self._event("response.output_item.done", output_index=index, item=_copy(item)),
        ]

    def _call_item(self, piece: Call) -> dict[str, Any]:
        call = piece.call
        item = {
            "type": "function_call",
            "id": new_id("fc"),
            "call_id": f"call_{call.id}",
            "name": call.name,
            "arguments": call.arguments_json,
            "status": "completed",
        }
        if call.name in self.namespaces:
            item["namespace"] = self.namespaces[call.name]
        return item

    def absorb(self, event: Token) -> None:
        self.answer.feed(event.text)

    # -- whole -----------------------------------------------------------------------------
    def whole(self, done: Done, queued_s: float) -> dict[str, Any]:
        self.answer.feed(done.tail)
        self.answer.finish()
        if self.answer.reasoning:
            part = {"type": "reasoning_text", "text": self.answer.reasoning}
            self.items.append(
                {"type": "reasoning", "id": new_id("rs"), "summary": [], "content": [part]}
            )
        if self.answer.text:
            part = {"type": "output_text", "text": self.answer.text, "annotations": []}
            self.items.append(
                {
                    "type": "message",
                    "id": new_id("msg"),
                    "status": "incomplete" if status_of(done) == "cancelled" else status_of(done),
                    "role": "assistant",
                    "content": [part],
                }
            )
        self.items += [self._call_item(Call(c)) for c in self.answer.calls]
        out = self.response(status_of(done), done)
        out["macspec"] = figures(self.meta, done, queued_s)
        self._kept()
        return out

    def _kept(self) -> None:
        if self.on_done is not None:
            self.on_done(self.id, self.items)


def status_of(done: Done) -> str:
    """The Responses API's status: 'cancelled' (one of its own) when the server ended the
    answer itself, 'incomplete' at the token limit, else 'completed'."""
    if done.finish_reason == "cancelled":
        return "cancelled"
    return "incomplete" if done.finish_reason in ("length", "context") else "completed"


def _dump(value: Any) -> Any:
    return value.model_dump(exclude_none=True) if hasattr(value, "model_dump") else value


def _copy(item: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(item))


def output_messages(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A response's output items as chat-template messages (for previous_response_id)."""
    from macspec.serve.responses_schema import input_messages

    return input_messages(items)


def add_routes(app: FastAPI, models: Served, authorized) -> None:
    """POST /v1/responses."""
    kept = Kept()

    @app.post("/v1/responses", dependencies=[Depends(authorized)])
    async def responses(request: Request):
        body = await parse(request, ResponsesRequest)
        async with models.lease(body.model) as backend:
            return await respond(request, body, backend)

    async def respond(request: Request, body: ResponsesRequest, backend: Backend):
        history = kept.get(body.previous_response_id) if body.previous_response_id else []
        turn = body.to_turn(history)
        prepared = await run_in_threadpool(backend.prepare_turn, turn)
        meta = new_meta(
            "resp", backend.model_id, len(prepared.prompt), draft=backend.draft, k=backend.k
        )
        renderer = ResponseRenderer(body, len(prepared.prompt), prepared.answer_stream(), meta)
        if body.store is not False:
            conversation = turn.messages

            def keep(response_id: str, items: list[dict[str, Any]]) -> None:
                kept.add(response_id, [*conversation, *output_messages(items)])

            renderer.on_done = keep
        return await answer(request, backend, prepared, body.stream, renderer)


__all__ = ["add_routes", "error_body"]
