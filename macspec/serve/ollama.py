"""Ollama's REST API beside the others, on the same port and engine: `POST /api/chat` and
`/api/generate` (newline-delimited JSON streams, or one object with `"stream": false`),
`GET /api/tags`, `/api/ps`, `/api/version`, `POST /api/show`; pull, push, create, copy and
delete are a 501 naming the macspec command that does the job. Errors are Ollama's
`{"error": "..."}` with its status codes.

A stream is one object per piece of the answer (`message.content`, `message.thinking`,
`message.tool_calls`; `response` and `thinking` for generate), then a last object with
`done: true`, `done_reason` ('stop' or 'length') and the metrics in nanoseconds:
`total_duration` (from the request to the end), `load_duration` (the
wait for the model: the pool's load of it, if it had to, and the queue), `prompt_eval_count`
and `prompt_eval_duration` (the prompt and its prefill), `eval_count` and `eval_duration`.
"""

from __future__ import annotations

import json
import time
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from macspec.engine.core.events import Done, Prefill, Token
from macspec.models.answer_stream import AnswerStream, Call, Piece, Reasoning
from macspec.models.templates import has_chat_template
from macspec.serve.backend import Backend, Prepared
from macspec.serve.bodies import parse
from macspec.serve.errors import APIError
from macspec.serve.jobs import answer, log_line
from macspec.serve.notes import log_once
from macspec.serve.ollama_models import ServedModel, described, elapsed_ns, nanoseconds, now
from macspec.serve.ollama_schema import ChatRequest, GenerateRequest
from macspec.serve.render import Meta, figures, finished, new_meta
from macspec.serve.served import Served

VERSION = "0.33.0"
"""The Ollama version whose API this mirrors (clients gate features on it)."""
NOT_HERE = {
    "pull": "download with `macspec pull NAME`, then serve it with `macspec serve --model NAME`",
    "push": "macspec does not publish models",
    "create": "macspec serves models as they lie: `macspec serve --model PATH|REPO|ollama:NAME`",
    "copy": "macspec reads models where they lie and never copies them",
    "delete": "remove a downloaded model with `macspec rm NAME`",
    "embed": "macspec serves a generation model; embeddings are not served",
    "embeddings": "macspec serves a generation model; embeddings are not served",
}


def is_ollama(request: Request) -> bool:
    return request.url.path.startswith("/api/")


def error_response(error: APIError) -> JSONResponse:
    """An error as Ollama sends it: {"error": "..."}; a full context is a 400 there."""
    status = 400 if error.code == "context_length_exceeded" else error.status
    return JSONResponse({"error": error.message}, status_code=status)


def line(payload: dict[str, Any]) -> str:
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")) + "\n"


def done_reason(done: Done) -> str:
    return "length" if done.finish_reason in ("length", "context") else "stop"


def ollama_call(piece: Call, index: int) -> dict[str, Any]:
    call = piece.call
    function = {"index": index, "name": call.name, "arguments": call.arguments}
    return {"id": call.id, "function": function}


class OllamaRenderer:
    """One generation as Ollama's chat (`message`) or generate (`response`) objects."""

    media_type = "application/x-ndjson"

    def __init__(
        self, model: str, chat: bool, prepared: Prepared, started: float, meta: Meta, context: bool
    ):
        self.model = model
        self.chat = chat
        self.prompt = prepared.prompt
        self.answer: AnswerStream = prepared.answer_stream()
        self.started = started
        self.load_s = 0.0
        """The wait for the model to load (the pool's first request for it), else 0."""
        self.meta = meta
        self.context = context
        """Whether generate's last object carries `context` (the prompt and answer ids)."""
        self.calls_sent = 0

    def _object(self, text: str = "", thinking: str = "", calls=None) -> dict[str, Any]:
        out: dict[str, Any] = {"model": self.model, "created_at": now()}
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if thinking:
                message["thinking"] = thinking
            if calls:
                message["tool_calls"] = calls
            out["message"] = message
        else:
            out["response"] = text
            if thinking:
                out["thinking"] = thinking
            if calls:
                out["tool_calls"] = calls
        return out

    def _calls(self, calls: list[Call]) -> list[dict[str, Any]]:
        out = [ollama_call(c, self.calls_sent + i) for i, c in enumerate(calls)]
        self.calls_sent += len(calls)
        return out

    def _lines(self, pieces: list[Piece]) -> list[str]:
        out = []
        for piece in pieces:
            if isinstance(piece, Call):
                chunk = self._object(calls=self._calls([piece]))
            elif isinstance(piece, Reasoning):
                chunk = self._object(thinking=piece.text)
            else:
                chunk = self._object(piece.text)
            out.append(line({**chunk, "done": False}))
        return out

    def _final(self, done: Done, queued_s: float, body: dict[str, Any]) -> dict[str, Any]:
        stats = done.stats
        final = {
            **body,
            "done": True,
            "done_reason": done_reason(done),
            "total_duration": elapsed_ns(self.started),
            "load_duration": nanoseconds(self.load_s + queued_s),
            "prompt_eval_count": len(self.prompt),
            "prompt_eval_duration": nanoseconds(stats.prefill_s),
            "eval_count": len(done.tokens),
            "eval_duration": nanoseconds(stats.elapsed_s - stats.prefill_s),
        }
        if self.context and not self.chat:
            final["context"] = [*self.prompt, *done.tokens]
        return {**final, "macspec": figures(self.meta, done, queued_s)}

    # -- streaming -------------------------------------------------------------------------
    def opening(self) -> list[str]:
        return []

    def prefilled(self, event: Prefill) -> list[str]:
        return []

    def token(self, event: Token) -> list[str]:
        return self._lines(self.answer.feed(event.text))

    def closing(self, done: Done, queued_s: float) -> list[str]:
        out = self._lines(self.answer.feed(done.tail) + self.answer.finish())
        return [*out, line(self._final(done, queued_s, self._object()))]

    def keepalive(self) -> str:
        return ""  # NDJSON has no comment line; Ollama's clients parse every line

    def failed(self, message: str) -> list[str]:
        return [line({"error": message})]

    def summary(self) -> str:
        calls = len(self.answer.calls)
        return f"{calls} tool call{'s' if calls != 1 else ''}" if calls else ""

    # -- whole -----------------------------------------------------------------------------
    def absorb(self, event: Token) -> None:
        self.answer.feed(event.text)

    def whole(self, done: Done, queued_s: float) -> dict[str, Any]:
        answer = finished(self.answer, done)
        calls = [p for p in answer.pieces if isinstance(p, Call)]
        body = self._object(answer.text, answer.reasoning.strip("\n"), self._calls(calls))
        return self._final(done, queued_s, body)


def loaded(model: str, chat: bool, request_unloads: bool) -> dict[str, Any]:
    """Ollama's answer to a request with nothing to generate: the model is loaded (or, with
    keep_alive 0, unloaded; here it stays loaded for the server's other clients)."""
    out: dict[str, Any] = {"model": model, "created_at": now()}
    if chat:
        out["message"] = {"role": "assistant", "content": ""}
    else:
        out["response"] = ""
    return {**out, "done": True, "done_reason": "unload" if request_unloads else "load"}


def add_routes(app: FastAPI, models: Served, authorized) -> None:
    """Ollama's /api routes (and GET and HEAD /: 'Ollama is running')."""
    guarded = [Depends(authorized)]

    def check(name: str) -> None:
        """Ollama's 404 for a model this server does not serve."""
        try:
            models.check(name)
        except APIError:
            raise APIError(404, f"model '{name}' not found", "model") from None

    async def generation(request: Request, body, chat: bool, prepare) -> Any:
        started = time.perf_counter()
        check(body.model)
        empty = not body.messages if chat else not (body.prompt or body.suffix)
        if empty:  # Ollama's way to load a model, or (keep_alive 0) to unload it
            if body.unloads():
                models.unload(body.model)
            else:
                async with models.lease(body.model, body.keep_alive):
                    pass
            log_line(request, 200, "nothing to generate: the model is loaded")
            return loaded(body.model, chat, body.unloads())
        async with models.lease(body.model, body.keep_alive) as backend:
            load_s = time.perf_counter() - started  # the pool's load, if it had to
            served = described(backend)
            if body.think and not served.can_think:
                raise APIError(400, f'"{body.model}" does not support thinking', "think")
            prepared = await run_in_threadpool(prepare, backend, served)
            meta = new_meta(
                "ollama", backend.model_id, len(prepared.prompt), draft=backend.draft, k=backend.k
            )
            raw = not chat and body.raw
            renderer = OllamaRenderer(body.model, chat, prepared, started, meta, not raw)
            renderer.load_s = load_s
            return await answer(request, backend, prepared, body.streamed, renderer)

    @app.post("/api/chat", dependencies=guarded)
    async def chat(request: Request):
        body = await parse(request, ChatRequest)

        def prepare(backend: Backend, served: ServedModel) -> Prepared:
            if not has_chat_template(backend.tokenizer):  # Ollama's own route for plain text
                raise APIError(
                    400, "this model has no chat template: use /api/generate", "messages"
                )
            return backend.prepare_turn(body.to_turn())

        return await generation(request, body, True, prepare)

    @app.post("/api/generate", dependencies=guarded)
    async def generate(request: Request):
        body = await parse(request, GenerateRequest)

        def prepare(backend: Backend, served: ServedModel) -> Prepared:
            turn = body.to_turn()
            if body.suffix:  # the model's own fill-in-the-middle format, not its chat template
                return backend.prepare_text(served.insert_prompt(body.prompt, body.suffix), turn)
            if body.raw or not has_chat_template(backend.tokenizer):
                if body.system and not body.raw:
                    log_once("ollama: the model has no chat template: 'system' is not used")
                return backend.prepare_text(body.prompt, turn)  # Ollama's {{ .Prompt }}
            return backend.prepare_turn(turn)

        return await generation(request, body, False, prepare)

    @app.get("/api/tags", dependencies=guarded)
    @app.head("/api/tags", dependencies=guarded)
    async def tags(request: Request) -> dict:
        log_line(request, 200, "")
        return {"models": models.tags()}

    @app.get("/api/ps", dependencies=guarded)
    async def ps(request: Request) -> dict:
        log_line(request, 200, "")
        return {"models": models.running()}

    @app.post("/api/show", dependencies=guarded)
    async def show(request: Request) -> dict:
        raw = await request.body()
        try:
            data = json.loads(raw or b"{}")
        except ValueError:
            raise APIError(400, "the request body is not valid JSON") from None
        data = data if isinstance(data, dict) else {}
        name = str(data.get("model") or data.get("name") or "")
        if not name:
            raise APIError(400, "model is required", "model")
        check(name)
        log_line(request, 200, "")
        return await run_in_threadpool(models.show, name)

    @app.get("/api/version")
    @app.head("/api/version")
    async def version(request: Request) -> dict:
        return {"version": VERSION}

    async def not_here(request: Request) -> JSONResponse:
        action = request.url.path.rsplit("/", 1)[-1]
        message = f"/api/{action} is not served here: {NOT_HERE[action]}"
        log_line(request, 501, message)
        return JSONResponse({"error": message}, status_code=501)

    for action in ("pull", "push", "create", "copy", "embed", "embeddings"):
        app.add_api_route(f"/api/{action}", not_here, methods=["POST"], dependencies=guarded)
    app.add_api_route("/api/delete", not_here, methods=["DELETE"], dependencies=guarded)


def root_text() -> Response:
    """What Ollama answers at / (clients probe it to find a server)."""
    return Response("Ollama is running", media_type="text/plain; charset=utf-8")
