"""The HTTP side: a FastAPI app with one router per protocol (OpenAI chat completions and
completions here, the Responses API in responses.py, Anthropic's Messages API in anthropic.py,
Ollama's /api/* in ollama.py).

Every error a client can cause is a JSON body with its status, in the shape of the protocol the
request spoke (OpenAI's, Anthropic's on /v1/messages, Ollama's on /api/*); anything else is a
500 with a generic message (the traceback goes to the log, never to the client), and the server
goes on serving. One log line per request: status, tokens, tok/s, acceptance by drafter, tool calls.
"""

from __future__ import annotations

import logging
import secrets
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from macspec.serve import anthropic, ollama, responses
from macspec.serve.backend import Backend
from macspec.serve.bodies import describe, parse
from macspec.serve.errors import APIError, error_body
from macspec.serve.jobs import answer, log_line
from macspec.serve.render import Renderer, new_meta
from macspec.serve.schema import ChatCompletionRequest, CompletionRequest
from macspec.serve.served import OneModel, Served, model_card

log = logging.getLogger("macspec.serve")


def make_app(served: Backend | Served, api_key: str | None = None) -> FastAPI:
    """The ASGI app serving one backend, or a pool of models (`Served`); with `api_key`, /v1
    routes need it, as a bearer token or in the `x-api-key` header (Anthropic's clients send
    that)."""
    models: Served = OneModel(served) if isinstance(served, Backend) else served

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        models.start()
        yield
        models.stop()

    app = FastAPI(title="macspec", docs_url=None, redoc_url=None, lifespan=lifespan)

    def authorized(request: Request) -> None:
        if api_key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        token = token.strip() if scheme.lower() == "bearer" else ""
        token = token or request.headers.get("x-api-key", "").strip()
        if not token:
            raise APIError(
                401,
                "missing API key: this server needs one, sent as 'Authorization: Bearer KEY' "
                "or in the x-api-key header",
                None,
                "missing_api_key",
            )
        if not secrets.compare_digest(token.encode(), api_key.encode()):
            raise APIError(401, "Incorrect API key provided", None, "invalid_api_key")

    # -- errors, in the shape of the protocol the request spoke --------------------------
    def error_response(request: Request, error: APIError) -> JSONResponse:
        if anthropic.is_anthropic(request):
            return anthropic.error_response(error)
        if ollama.is_ollama(request):
            return ollama.error_response(error)
        return JSONResponse(error.body(), status_code=error.status)

    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError) -> JSONResponse:
        response = error_response(request, exc)
        log_line(request, response.status_code, exc.message)  # the status the client got
        return response

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = describe(exc)
        log_line(request, 400, message)
        return error_response(request, APIError(400, message, param))

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        message = {404: f"Unknown route {request.url.path}"}.get(exc.status_code, str(exc.detail))
        log_line(request, exc.status_code, message)
        code = "unknown_url" if exc.status_code == 404 else None
        return error_response(request, APIError(exc.status_code, message, None, code))

    @app.exception_handler(Exception)
    async def crashed(request: Request, exc: Exception) -> JSONResponse:
        log.error("%s %s 500", request.method, request.url.path, exc_info=exc)
        return error_response(request, APIError(500, "internal server error"))

    # -- routes ----------------------------------------------------------------------------
    @app.get("/health")
    async def health(request: Request) -> dict:
        workers = models.workers()
        log_line(request, 200, "")
        busy = any(w.busy for w in workers)
        return {"status": "ok", "busy": busy, "waiting": sum(w.waiting for w in workers)}

    @app.head("/")
    @app.get("/")
    async def root() -> Response:
        """Clients probe the base URL (Claude Code sends HEAD / first; Ollama's clients look
        for Ollama's words)."""
        return ollama.root_text()

    @app.get("/v1/models", dependencies=[Depends(authorized)])
    async def listed_models(request: Request) -> dict:
        log_line(request, 200, "")
        return {"object": "list", "data": models.cards()}

    @app.get("/v1/models/{name:path}", dependencies=[Depends(authorized)])
    async def model(request: Request, name: str) -> dict:
        models.check(name)
        log_line(request, 200, "")
        return next((c for c in models.cards() if c["id"] == name), model_card(name))

    @app.post("/v1/chat/completions", dependencies=[Depends(authorized)])
    async def chat_completions(request: Request):
        body = await parse(request, ChatCompletionRequest)
        async with models.lease(body.model) as backend:
            turn = body.to_turn()
            prepared = await run_in_threadpool(backend.prepare_turn, turn)
            renderer = Renderer(
                meta(backend, "chatcmpl", prepared, body), True, prepared.answer_stream()
            )
            return await answer(request, backend, prepared, body.stream, renderer)

    @app.post("/v1/completions", dependencies=[Depends(authorized)])
    async def completions(request: Request):
        body = await parse(request, CompletionRequest)
        async with models.lease(body.model) as backend:
            prepared = await run_in_threadpool(backend.prepare_completion, body)
            renderer = Renderer(meta(backend, "cmpl", prepared, body), False)
            return await answer(request, backend, prepared, body.stream, renderer)

    responses.add_routes(app, models, authorized)
    anthropic.add_routes(app, models, authorized)
    ollama.add_routes(app, models, authorized)
    return app


def meta(backend: Backend, prefix: str, prepared, body):
    return new_meta(
        prefix,
        backend.model_id,
        len(prepared.prompt),
        include_usage=body.include_usage,
        draft=backend.draft,
        k=backend.k,
    )


__all__ = ["error_body", "make_app"]
