"""The HTTP side: FastAPI routes that turn requests into jobs and jobs' events into responses.

Every error a client can cause is an OpenAI-style JSON body with its status; anything else is
a 500 with a generic message (the traceback goes to the log, never to the client), and the
server goes on serving. One log line per request: status, tokens, tok/s, acceptance.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TypeVar

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from macspec.engine.events import Done, Token
from macspec.serve.backend import Backend, Prepared
from macspec.serve.errors import APIError, error_body
from macspec.serve.render import Renderer, new_meta, sse
from macspec.serve.schema import ChatCompletionRequest, CompletionRequest
from macspec.serve.worker import Failed, Job, QueueFull

log = logging.getLogger("macspec.serve")
Body = TypeVar("Body", bound=BaseModel)
UNION_MEMBER = re.compile(r"^(str|int|float|bool|none|[a-z]+\[.*\]|[A-Z]\w*)$")
"""How pydantic names a union's member in an error's location."""

KEEPALIVE_S = 2.0
"""A stream waiting in the queue sends an SSE comment this often (it finds a gone client)."""
MAX_BODY_BYTES = 32 << 20
"""A request body larger than this is refused (413) before it is parsed."""
POLL_S = 0.25
"""A non-streamed request checks this often whether its client is still there."""


class ClientGone(Exception):
    """The client closed the connection before its answer was ready."""


def make_app(backend: Backend, api_key: str | None = None) -> FastAPI:
    """The ASGI app serving `backend`; with `api_key`, /v1 routes need `Bearer <api_key>`."""

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        backend.worker.start()
        yield
        backend.worker.stop()

    app = FastAPI(title="macspec", docs_url=None, redoc_url=None, lifespan=lifespan)

    def authorized(request: Request) -> None:
        if api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        matches = secrets.compare_digest(token.strip().encode(), api_key.encode())
        if scheme.lower() != "bearer" or not matches:
            raise APIError(401, "Incorrect API key provided", None, "invalid_api_key")

    # -- errors ----------------------------------------------------------------------------
    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError) -> JSONResponse:
        log_line(request, exc.status, exc.message)
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = describe(exc)
        log_line(request, 400, message)
        return JSONResponse(error_body(400, message, param), status_code=400)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        message = {404: f"Unknown route {request.url.path}"}.get(exc.status_code, str(exc.detail))
        log_line(request, exc.status_code, message)
        code = "unknown_url" if exc.status_code == 404 else None
        return JSONResponse(
            error_body(exc.status_code, message, None, code), status_code=exc.status_code
        )

    @app.exception_handler(Exception)
    async def crashed(request: Request, exc: Exception) -> JSONResponse:
        log.error("%s %s 500", request.method, request.url.path, exc_info=exc)
        return JSONResponse(error_body(500, "internal server error"), status_code=500)

    # -- routes ----------------------------------------------------------------------------
    @app.get("/health")
    async def health(request: Request) -> dict:
        worker = backend.worker
        log_line(request, 200, "")
        return {"status": "ok", "busy": worker.busy, "waiting": worker.waiting}

    @app.get("/v1/models", dependencies=[Depends(authorized)])
    async def models(request: Request) -> dict:
        log_line(request, 200, "")
        return {"object": "list", "data": [model_card(backend)]}

    @app.get("/v1/models/{name:path}", dependencies=[Depends(authorized)])
    async def model(request: Request, name: str) -> dict:
        backend.check_model(name)
        log_line(request, 200, "")
        return model_card(backend)

    @app.post("/v1/chat/completions", dependencies=[Depends(authorized)])
    async def chat_completions(request: Request):
        body = await parse(request, ChatCompletionRequest)
        backend.check_model(body.model)
        prepared = await run_in_threadpool(backend.prepare_chat, body)
        return await answer(request, backend, prepared, body.stream, body.include_usage, True)

    @app.post("/v1/completions", dependencies=[Depends(authorized)])
    async def completions(request: Request):
        body = await parse(request, CompletionRequest)
        backend.check_model(body.model)
        prepared = await run_in_threadpool(backend.prepare_completion, body)
        return await answer(request, backend, prepared, body.stream, body.include_usage, False)

    return app


def model_card(backend: Backend) -> dict:
    return {"id": backend.model_id, "object": "model", "created": 0, "owned_by": "macspec"}


async def answer(
    request: Request,
    backend: Backend,
    prepared: Prepared,
    stream: bool,
    include_usage: bool,
    chat: bool,
):
    """Queue the generation; stream its chunks or wait for the whole response."""
    meta = new_meta(
        "chatcmpl" if chat else "cmpl",
        backend.model_id,
        len(prepared.prompt),
        include_usage=include_usage,
        draft=backend.draft,
        k=backend.k,
    )
    renderer = Renderer(meta, chat, prepared.reasoning_start if chat else None)
    job = Job(prepared.prompt, prepared.config, asyncio.get_running_loop())
    try:
        backend.worker.submit(job)
    except QueueFull as exc:
        message = f"the server is busy ({exc}); retry later"
        raise APIError(429, message, None, "queue_full") from None
    if stream:
        return StreamingResponse(
            stream_chunks(request, backend, job, renderer),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    return await whole_response(request, backend, job, renderer)


async def whole_response(request: Request, backend: Backend, job: Job, renderer: Renderer):
    """Wait for the Done, checking now and then that the client is still there."""
    event = None
    try:
        while not isinstance(event, (Done, Failed)):
            event = await next_event(job, POLL_S, request)
    except ClientGone:
        log_line(request, 499, "client closed the connection before the answer")
        return JSONResponse(error_body(400, "client closed the connection"), status_code=499)
    finally:
        if not isinstance(event, (Done, Failed)):  # gone, or the server is stopping
            backend.worker.cancel(job)
    if isinstance(event, Failed):
        raise APIError(500, "the generation failed (see the server log)")
    log_done(request, 200, job, renderer.meta.prompt_tokens)
    return renderer.response(event, queued_s(job))


async def stream_chunks(
    request: Request, backend: Backend, job: Job, renderer: Renderer
) -> AsyncIterator[str]:
    """The SSE body; closing it early (the client went away) cancels the generation."""
    finished = False
    try:
        for chunk in renderer.first():
            yield sse(chunk)
        while True:
            event = await next_event(job, KEEPALIVE_S)
            if event is None:
                yield ": keep-alive\n\n"
            elif isinstance(event, Token):
                for chunk in renderer.delta(event.text):
                    yield sse(chunk)
            elif isinstance(event, Done):
                for chunk in renderer.last(event, queued_s(job)):
                    yield sse(chunk)
                yield sse("[DONE]")
                finished = True
                log_done(request, 200, job, renderer.meta.prompt_tokens)
                return
            else:  # Failed: the status is sent already; OpenAI's clients raise on this
                yield sse(error_body(500, "the generation failed (see the server log)"))
                finished = True
                log_line(request, 500, "generation failed mid-stream")
                return
    finally:
        if not finished:
            backend.worker.cancel(job)
            log_line(request, 499, "client closed the stream; generation cancelled")


async def next_event(job: Job, wait_s: float, request: Request | None = None):
    """The job's next event; None after `wait_s` without one. With `request`, raises
    ClientGone when its client has disconnected, else keeps waiting."""
    getter = asyncio.ensure_future(job.events.get())
    try:
        while True:
            done, _ = await asyncio.wait({getter}, timeout=wait_s)
            if done:
                return getter.result()
            if request is None:
                return None
            if await request.is_disconnected():
                raise ClientGone()
    finally:
        if not getter.done():
            getter.cancel()


def queued_s(job: Job) -> float:
    return (job.started_at or job.submitted_at) - job.submitted_at


async def parse(request: Request, schema: type[Body]) -> Body:
    """The JSON body as `schema`, whatever the Content-Type says (curl -d sends a form type);
    a 400 naming the first bad field otherwise."""
    raw = await request.body()
    if len(raw) > MAX_BODY_BYTES:
        raise APIError(413, f"the request body is over {MAX_BODY_BYTES >> 20} MiB")
    try:
        data = json.loads(raw)
    except ValueError:
        raise APIError(400, "the request body is not valid JSON") from None
    if not isinstance(data, dict):
        raise APIError(400, "the request body must be a JSON object")
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        message, param = describe(exc)
        raise APIError(400, message, param) from None


def describe(exc: RequestValidationError | ValidationError) -> tuple[str, str | None]:
    """A validation error as one message and the offending parameter, OpenAI-style."""
    errors = exc.errors()
    if not errors:
        return "invalid request", None
    # A union field gives one error per member: the deepest one says most (a content part's
    # bad type rather than "not a string"); member names ('str', 'list[TextPart]') are dropped.
    first = max(errors, key=lambda e: len(e.get("loc", ())))
    where = [str(p) for p in first.get("loc", ()) if p != "body" and not UNION_MEMBER.match(str(p))]
    param = ".".join(where) or None
    if first.get("type") == "missing":
        return f"missing required parameter: '{param}'", param
    message = first.get("msg", "invalid value")
    return (f"invalid '{param}': {message}" if param else message), param


def log_line(request: Request, status: int, detail: str) -> None:
    tail = f" · {detail}" if detail else ""
    log.info("%s %s %d%s", request.method, request.url.path, status, tail)


def log_done(request: Request, status: int, job: Job, prompt_tokens: int) -> None:
    """The line of a finished generation: tokens, speed, acceptance."""
    done = job.done
    if done is None:
        return log_line(request, status, "")
    stats = done.stats
    cached = prompt_tokens - stats.prefilled_tokens
    parts = [f"{prompt_tokens} prompt ({cached} cached) + {len(done.tokens)} tokens"]
    if stats.decode_tokens_per_s is not None:
        parts.append(f"{stats.decode_tokens_per_s:.1f} tok/s")
    if stats.acceptance_rate is not None:
        parts.append(f"acceptance {stats.acceptance_rate:.0%}")
    if stats.tokens_per_pass is not None:
        parts.append(f"{stats.tokens_per_pass:.2f} tokens/pass")
    parts.append(f"ttft {stats.ttft_s:.2f}s")
    parts.append(f"queued {queued_s(job):.2f}s")
    parts.append(done.finish_reason)
    log_line(request, status, " · ".join(parts))
