"""One generation at a time: a worker thread owns the engine; requests wait in a FIFO queue.

The HTTP side (asyncio) submits a `Job` and reads its events from an asyncio queue the worker
fills thread-safely. A full queue refuses the job at once (the server answers 429). A job whose
client went away is cancelled: while waiting it leaves the queue, while generating the engine's
`cancelled` callable stops it after the current token, and the caches keep what was delivered.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from macspec.engine.core.events import Cycle, Done, Token
from macspec.engine.core.streams import release_streams
from macspec.engine.generate.distributed import Diverged, PeerLost
from macspec.engine.generate.loop import Engine, GenerationConfig
from macspec.prefix.tier import generate as generate_cached
from macspec.serve.budget import ThinkingBudget, budgeted
from macspec.serve.prompt_cache import PromptCache

if TYPE_CHECKING:
    from macspec.serve.ranks import Leader

log = logging.getLogger("macspec.serve")


class QueueFull(Exception):
    """No room in the queue for another request."""


class ShuttingDown(Exception):
    """A request still waiting when the server was told to stop now."""


@dataclass(frozen=True)
class Failed:
    """The generation raised: the last event of a job, instead of a Done."""

    error: BaseException


@dataclass(eq=False)  # a job is itself: compared and hashed by identity
class Job:
    """One request's generation, from the HTTP side's point of view."""

    prompt: list[int]
    config: GenerationConfig
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    """Token, then one Done or Failed; filled by the worker thread."""
    cancel_flag: threading.Event = field(default_factory=threading.Event)
    submitted_at: float = field(default_factory=time.perf_counter)
    started_at: float | None = None
    """When the worker began it (after waiting in the queue)."""
    done: Done | None = None
    """The engine's last event, once it came (set on the worker thread)."""
    budget: ThinkingBudget | None = None
    """At most this much reasoning, then the answer (Anthropic's thinking budget)."""

    def cancelled(self) -> bool:
        return self.cancel_flag.is_set()

    def post(self, event: Token | Done | Failed) -> None:
        """From the worker thread: hand an event to the request's coroutine."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the event loop is gone (shutdown): nobody will read on
            self.cancel_flag.set()


class Worker:
    """The thread that runs every generation on the engine, in order of arrival."""

    def __init__(
        self,
        engine: Engine,
        max_queue: int = 32,
        prompt_cache_size: int = 4,
        leader: Leader | None = None,
    ):
        self.engine = engine
        self.leader = leader
        """Under mlx.launch: tells the other ranks each generation before it runs."""
        self.on_fatal: Callable[[BaseException], None] | None = None
        """Called (on the worker thread) when no generation can run any more: a lost rank
        (the server sets it to stop itself)."""
        self.fatal: BaseException | None = None
        self.max_queue = max_queue
        """Most requests waiting while one generates; more are refused (429)."""
        self.prompt_cache = PromptCache(engine, prompt_cache_size)
        self._waiting: deque[Job] = deque()
        self._running: Job | None = None
        self._lock = threading.Condition()
        self._stopping = False
        self.recent: deque[Done] = deque(maxlen=32)
        """The latest generations' Done events, newest last (cancelled ones too)."""
        self._thread = threading.Thread(target=self._run, name="macspec-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    # -- the HTTP side ---------------------------------------------------------------------
    def submit(self, job: Job) -> None:
        """Queue a job, or raise QueueFull."""
        with self._lock:
            if self._stopping:
                raise QueueFull("the server is shutting down")
            generating, waiting = self.generating, len(self._waiting)
            if generating + waiting >= self.capacity + self.max_queue:
                # Those waiting beyond what can generate at once are the queue.
                requests = "request" if generating == 1 else "requests"
                raise QueueFull(
                    f"the queue is full: {generating} {requests} generating, {waiting} "
                    f"waiting (--max-queue {self.max_queue})"
                )
            self._waiting.append(job)
            self._lock.notify()

    def cancel(self, job: Job) -> None:
        """The client went away: drop the job if it waits, stop it if it runs."""
        job.cancel_flag.set()
        with self._lock:
            if job in self._waiting:
                self._waiting.remove(job)

    def cancel_all(self) -> None:
        """Stop every request (a second Ctrl-C), so the server can finish shutting down: those
        generating end at once, as 'cancelled'; those waiting get 'the server is shutting
        down'; new ones are refused."""
        with self._lock:
            self._stopping = True
            for job in self._waiting:
                job.cancel_flag.set()
                job.post(Failed(ShuttingDown("the server is shutting down")))
            self._waiting.clear()
            for job in self._generating():
                job.cancel_flag.set()
            self._lock.notify()

    def _generating(self) -> list[Job]:
        """The requests generating now (with the lock held)."""
        return [self._running] if self._running is not None else []

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    capacity = 1
    """Generations that run at once."""

    @property
    def generating(self) -> int:
        return int(self._running is not None)

    @property
    def stopping(self) -> bool:
        return self._stopping

    @property
    def busy(self) -> bool:
        return self._running is not None

    def stop(self, timeout: float = 10.0) -> None:
        """Cancel what is left (waiting and running) and end the thread."""
        self.cancel_all()
        if self._thread.is_alive():
            self._thread.join(timeout)

    # -- the worker thread -----------------------------------------------------------------
    def _next(self) -> Job | None:
        with self._lock:
            while not self._waiting and not self._stopping:
                self._lock.wait()
            if self._stopping:
                return None
            self._running = self._waiting.popleft()
            return self._running

    def _run(self) -> None:
        try:
            while (job := self._next()) is not None:
                try:
                    self._generate(job)
                finally:
                    with self._lock:
                        self._running = None
        finally:
            # Work queued with async_eval (a draft queued ahead) finishes before the thread
            # ends, and its streams go with it: none may outlive it into the process's exit.
            # Not after lost ranks: a collective that never ends would hold the thread.
            if self.fatal is None:
                release_streams()

    def _events(self, job: Job):
        """The engine's events for a job (two generations with a thinking budget spent)."""

        def generate(prompt, config, cancelled):
            if self.leader is not None:
                self.leader.announce(prompt, config)
            # From the longest prefix cached in memory (prepared below) or on disk.
            return generate_cached(self.engine, prompt, config, cancelled)

        if job.budget is None:
            return generate(job.prompt, job.config, job.cancelled)

        def encode(text: str) -> list[int]:
            return list(self.engine.tokenizer.encode(text, add_special_tokens=False))

        return budgeted(generate, encode, job.prompt, job.config, job.budget, job.cancelled)

    def _generate(self, job: Job) -> None:
        job.started_at = time.perf_counter()
        if job.cancelled():  # its client left as it reached the front of the queue
            return
        if self.fatal is not None:  # queued before the ranks were lost; the server is stopping
            job.post(Failed(self.fatal))
            return
        try:
            self.prompt_cache.prepare(job.prompt)
            for event in self._events(job):
                if isinstance(event, Cycle):
                    continue
                if isinstance(event, Done):
                    job.done = event
                    self.recent.append(event)
                job.post(event)
        except (PeerLost, Diverged) as exc:  # the ranks cannot generate together any more
            self.fatal = exc  # the command says why, in one line, once the server stopped
            job.post(Failed(exc))
            if self.on_fatal is not None:
                self.on_fatal(exc)
        except Exception as exc:  # a bug or an MLX failure: a 500 for this request only
            log.exception("generation failed")
            job.post(Failed(exc))
        finally:
            if self.leader is not None:
                self.leader.idle()
