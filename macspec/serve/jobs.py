"""From a prepared request to an HTTP answer, for every protocol alike: queue the job, then
stream its events through the protocol's renderer, or wait for the whole answer.

A renderer turns the engine's events into one protocol's stream (server-sent events) and its
whole response; the loop here owns what all protocols share: the queue's 429, keep-alives
while a request waits or its prompt is prefilled, a client that goes away (its generation is
cancelled), a generation that fails (a 500, or an error event once the stream has begun), and
one log line per request.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any, Protocol

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from macspec.engine.core.events import Done, Prefill, Token
from macspec.engine.core.stats import sources_line, tree_text
from macspec.serve.backend import Backend, Prepared
from macspec.serve.errors import APIError
from macspec.serve.worker import Failed, Job, QueueFull, ShuttingDown

log = logging.getLogger("macspec.serve")

KEEPALIVE_S = 2.0
"""A stream with nothing to send (queued, or prefilling a long prompt) sends a keep-alive this
often: clients do not time out, and a gone client is noticed."""
POLL_S = 0.25
"""A non-streamed request checks this often whether its client is still there."""


class ClientGone(Exception):
    """The client closed the connection before its answer was ready."""


class Renderer(Protocol):
    """One protocol's view of a generation."""

    def opening(self) -> list[str]:
        """Events sent as soon as the request is queued."""

    def prefilled(self, event: Prefill) -> list[str]:
        """Events once the engine knows how much of the prompt was cached."""

    def token(self, event: Token) -> list[str]:
        """Events for one token's text (none while text is held back)."""

    def closing(self, done: Done, queued_s: float) -> list[str]:
        """The last events: held-back text, the finish reason, usage."""

    def keepalive(self) -> str:
        """An event that keeps the connection open and says nothing."""

    def failed(self, message: str) -> list[str]:
        """The error, once the stream has begun (the status is sent already)."""

    def absorb(self, event: Token) -> None:
        """A token of a non-streamed answer: its text is parsed, nothing is rendered."""

    def whole(self, done: Done, queued_s: float) -> dict[str, Any]:
        """The non-streamed response body (after every token was absorbed)."""

    def summary(self) -> str:
        """What the log line adds about the answer (tool calls), or ''."""


async def answer(
    request: Request, backend: Backend, prepared: Prepared, stream: bool, renderer: Renderer
):
    """Queue the generation; stream its events or wait for the whole response."""
    job = Job(prepared.prompt, prepared.config, asyncio.get_running_loop())
    job.budget = prepared.thinking_budget
    try:
        backend.worker.submit(job)
    except QueueFull as exc:
        if backend.worker.stopping:  # Anthropic's clients read 529 as "overloaded, retry"
            raise APIError(503, f"{exc}; retry later", None, "shutting_down") from None
        raise APIError(429, f"the server is busy: {exc}; retry later", None, "queue_full") from None

    if stream:
        return StreamingResponse(
            stream_events(request, backend, job, renderer, len(prepared.prompt)),
            media_type=getattr(renderer, "media_type", "text/event-stream"),
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    return await whole_response(request, backend, job, renderer, len(prepared.prompt))


async def whole_response(
    request: Request, backend: Backend, job: Job, renderer: Renderer, prompt_tokens: int
):
    """Wait for the Done, checking now and then that the client is still there."""
    event = None
    try:
        while not isinstance(event, (Done, Failed)):
            event = await next_event(job, POLL_S, request)
            if isinstance(event, Token):
                renderer.absorb(event)
    except ClientGone:
        log_line(request, 499, "client closed the connection before the answer")
        return JSONResponse({"error": "client closed the connection"}, status_code=499)
    finally:
        if not isinstance(event, (Done, Failed)):  # gone, or the server is stopping
            backend.worker.cancel(job)
    if isinstance(event, Failed):
        raise failure(event)
    body = renderer.whole(event, queued_s(job))
    log_done(request, 200, job, prompt_tokens, renderer.summary())
    return body


def failure(failed: Failed) -> APIError:
    """What a generation that failed tells its client: a 503 when the server was told to stop
    before it began, else a 500 (the log has the traceback)."""
    if isinstance(failed.error, ShuttingDown):
        return APIError(503, f"{failed.error}; retry later", None, "shutting_down")
    return APIError(500, "the generation failed (see the server log)")


async def stream_events(
    request: Request, backend: Backend, job: Job, renderer: Renderer, prompt_tokens: int
) -> AsyncIterator[str]:
    """The SSE body; closing it early (the client went away) cancels the generation."""
    finished = False
    try:
        for chunk in renderer.opening():
            yield chunk
        while True:
            event = await next_event(job, KEEPALIVE_S)
            if event is None:
                keepalive = renderer.keepalive()
                if keepalive:  # NDJSON has none: a disconnect is noticed by starlette
                    yield keepalive
            elif isinstance(event, Prefill):
                for chunk in renderer.prefilled(event):
                    yield chunk
            elif isinstance(event, Token):
                for chunk in renderer.token(event):
                    yield chunk
            elif isinstance(event, Done):
                for chunk in renderer.closing(event, queued_s(job)):
                    yield chunk
                finished = True
                log_done(request, 200, job, prompt_tokens, renderer.summary())
                return
            else:  # Failed: the status is sent already; the clients raise on this event
                error = failure(event)
                for chunk in renderer.failed(error.message):
                    yield chunk
                finished = True
                log_line(request, error.status, f"mid-stream: {error.message}")
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


def log_line(request: Request, status: int, detail: str) -> None:
    tail = f" · {detail}" if detail else ""
    log.info("%s %s %d%s", request.method, request.url.path, status, tail)


def log_done(
    request: Request, status: int, job: Job, prompt_tokens: int, summary: str = ""
) -> None:
    """The line of a finished generation: tokens, speed, acceptance (by drafter), calls."""
    done = job.done
    if done is None:
        return log_line(request, status, "")
    stats = done.stats
    cached = prompt_tokens - stats.prefilled_tokens
    disk = f", {stats.disk_tokens} from disk" if stats.disk_tokens else ""
    parts = [f"{prompt_tokens} prompt ({cached} cached{disk}) + {len(done.tokens)} tokens"]
    if stats.decode_tokens_per_s is not None:
        parts.append(f"{stats.decode_tokens_per_s:.1f} tok/s")
    if stats.acceptance_rate is not None:
        by_source = sources_line(stats.by_source)
        parts.append(
            f"acceptance {stats.acceptance_rate:.0%}" + (f" ({by_source})" if by_source else "")
        )
    if stats.tokens_per_pass is not None:
        parts.append(f"{stats.tokens_per_pass:.2f} tokens/pass")
    if stats.rows_per_pass is not None and stats.rows_per_pass > 1:
        parts.append(f"{stats.rows_per_pass:.1f} requests per pass")
    trees = tree_text(stats)
    if trees:
        parts.append(trees)
    parts.append(f"ttft {stats.ttft_s:.2f}s")
    parts.append(f"queued {queued_s(job):.2f}s")
    if stats.disk_written_bytes:  # SSD wear, visible: a prefix cached already writes nothing
        parts.append(f"prompt cache +{stats.disk_written_bytes / 1e6:.1f} MB")
    if summary:
        parts.append(summary)
    parts.append(done.finish_reason)
    log_line(request, status, " · ".join(parts))
