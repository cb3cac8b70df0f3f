"""The model pool of `macspec serve` without `--model`: a model loads when a request first names
it, each loaded model has its own backend (scheduler, worker, prompt cache), and models unload
when their keep_alive runs out or room is needed for another (the least recently used idle one
first), as Ollama does.

A request holds a lease on its model from the name's lookup until its job is queued; a model is
unloaded only when no lease is held and its worker has nothing generating or waiting, so an
answer in flight always finishes first. Loads run outside the lock; requests for a model being
loaded wait for that one load, and a failed load answers each of them with its error.
"""

from __future__ import annotations

import gc
import logging
import math
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from starlette.concurrency import run_in_threadpool

from macspec.errors import MacspecError
from macspec.serve.backend import Backend
from macspec.serve.errors import APIError
from macspec.serve.servable import Servable

log = logging.getLogger("macspec.serve")

DEFAULT_KEEP_ALIVE_S = 300.0
"""Ollama's default: a model stays loaded 5 minutes after its last request."""
REAP_S = 0.2
"""How often expired idle models are looked for."""
_DURATION = re.compile(r"^(-?\d+(?:\.\d+)?)(ms|s|m|h)?$")
_UNIT_S = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def keep_alive_seconds(value: Any, param: str = "keep_alive") -> float | None:
    """Ollama's keep_alive: seconds as a number, or a duration ('5m', '30s', '1h', '-1');
    negative: kept loaded (None); 0: unloaded once the request is answered. A 400 otherwise."""
    if isinstance(value, bool):
        value = None
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value).strip()) if value is not None else None
        if match is None:
            raise APIError(400, f"{param}: {value!r} is not a duration ('5m', '30s', 0, -1)", param)
        seconds = float(match[1]) * _UNIT_S[match[2]]
    return None if seconds < 0 or math.isinf(seconds) else seconds


def gib(n: int | None) -> str:
    return "unknown" if n is None else f"{n / 2**30:.1f} GiB"


@dataclass(eq=False)
class Loaded:
    """A loaded model: its backend, its leases, and when it expires."""

    servable: Servable
    backend: Backend
    size_bytes: int
    leases: int = 0
    expires_at: float | None = None
    """time.time() past which it unloads when idle; None: never."""
    extras: dict[str, Any] = field(default_factory=dict)
    """What the listings computed once about it (its Ollama description)."""

    @property
    def idle(self) -> bool:
        worker = self.backend.worker
        return self.leases == 0 and worker.generating + worker.waiting == 0


class ModelPool:
    """Name -> loaded backend, loading on first use and unloading by keep_alive and budget."""

    def __init__(
        self,
        models: list[Servable],
        load: Callable[[Servable], Backend],
        keep_alive_s: float | None = DEFAULT_KEEP_ALIVE_S,
        max_loaded: int | None = None,
        budget_bytes: int | None = None,
    ):
        self.models = models
        # A model's own id wins over another's alias (an LM Studio repo named like an HF one).
        self._by_name = {m.model_id: m for m in reversed(models)}
        for model in models:
            for name in model.names:
                self._by_name.setdefault(name, model)
        self._load = load
        self.keep_alive_s = keep_alive_s
        self.max_loaded = max_loaded
        self.budget_bytes = budget_bytes
        self._loaded: OrderedDict[str, Loaded] = OrderedDict()
        """By model id, least recently used first."""
        self._loading: dict[str, tuple[Future, int]] = {}
        """Model id -> (the load's outcome, the bytes it reserves)."""
        self._lock = threading.Condition()
        self._stopping = threading.Event()
        self._reaper = threading.Thread(target=self._reap, name="macspec-pool", daemon=True)
        self.loads = 0
        """Loads started (tests check a model loads once for concurrent requests)."""

    # -- names -----------------------------------------------------------------------------
    def find(self, name: str) -> Servable:
        """The model `name` names, or OpenAI's 404."""
        found = self._by_name.get(name)
        if found is None:
            served = ", ".join(m.model_id for m in self.models[:8])
            more = f" and {len(self.models) - 8} more" if len(self.models) > 8 else ""
            message = f"The model '{name}' does not exist (this server has: {served}{more})"
            raise APIError(404, message, "model", "model_not_found")
        return found

    # -- leases ----------------------------------------------------------------------------
    @asynccontextmanager
    async def lease(self, name: str, keep_alive: Any = None):
        """The backend serving `name` (loaded if need be) for one request; on exit its keep_alive
        starts (the request's, else the server's)."""
        seconds = self.keep_alive_s if keep_alive is None else keep_alive_seconds(keep_alive)
        entry = await run_in_threadpool(self.acquire, name)
        try:
            yield entry.backend
        finally:
            self.release(entry, seconds)

    def acquire(self, name: str) -> Loaded:
        """Block until `name`'s model is loaded; hold a lease on it."""
        servable = self.find(name)
        key = servable.model_id
        while True:
            with self._lock:
                if key in self._loaded:
                    entry = self._loaded[key]
                    entry.leases += 1
                    self._loaded.move_to_end(key)
                    return entry
                if key in self._loading:
                    outcome = self._loading[key][0]
                    loads = False
                else:
                    outcome = Future()
                    self._loading[key] = (outcome, servable.required_bytes)
                    self.loads += 1
                    loads = True
            if loads:
                return self._load_one(servable, outcome)
            outcome.result()  # the loader's error, raised here for each waiter too

    def release(self, entry: Loaded, keep_alive_s: float | None) -> None:
        with self._lock:
            entry.leases -= 1
            entry.expires_at = None if keep_alive_s is None else time.time() + keep_alive_s
            self._lock.notify_all()

    def _load_one(self, servable: Servable, outcome: Future) -> Loaded:
        key = servable.model_id
        try:
            self._make_room(servable)
            started = time.perf_counter()
            backend = self._load(servable)
            backend.worker.start()
            log.info("loaded %s in %.1f s", key, time.perf_counter() - started)
        except BaseException as exc:
            error = exc if isinstance(exc, APIError) else APIError(500, f"{key}: {exc}")
            if not isinstance(exc, (APIError, MacspecError)):
                log.error("loading %s failed", key, exc_info=exc)
            with self._lock:
                del self._loading[key]
                self._lock.notify_all()
            outcome.set_exception(error)
            raise error from None
        entry = Loaded(servable, backend, servable.required_bytes, leases=1)
        with self._lock:
            del self._loading[key]
            self._loaded[key] = entry
            self._lock.notify_all()
        outcome.set_result(None)
        return entry

    # -- room ------------------------------------------------------------------------------
    def _make_room(self, servable: Servable) -> None:
        """Unload the least recently used idle models until `servable` fits the budget (waiting
        for busy ones to finish); Ollama's 500 when it cannot fit even alone."""
        need = servable.required_bytes
        if self.budget_bytes is not None and need > self.budget_bytes:
            raise APIError(
                500,
                f"model requires more system memory ({gib(need)}) than is available "
                f"({gib(self.budget_bytes)})",
            )
        with self._lock:
            while self._over_budget(servable):
                victim = next((e for e in self._loaded.values() if e.idle), None)
                if victim is None:
                    self._lock.wait(REAP_S)  # a model in use finishes its answers first
                    continue
                self._unload(victim, "to make room for " + servable.model_id)

    def _over_budget(self, servable: Servable) -> bool:
        """With the lock held: whether loading `servable` now would exceed a limit."""
        key = servable.model_id
        others = [r for k, (_, r) in self._loading.items() if k != key]
        count = len(self._loaded) + len(others) + 1
        used = sum(e.size_bytes for e in self._loaded.values()) + sum(others)
        if not self._loaded:
            return False  # nothing left to unload: it loads (alone it fits)
        if self.max_loaded is not None and count > self.max_loaded:
            return True
        return self.budget_bytes is not None and used + servable.required_bytes > self.budget_bytes

    def _unload(self, entry: Loaded, why: str) -> None:
        """With the lock held, an idle model: its worker ends, its memory is freed."""
        del self._loaded[entry.servable.model_id]
        entry.backend.worker.stop()
        log.info("unloaded %s (%s)", entry.servable.model_id, why)
        entry.backend = None  # type: ignore[assignment]
        gc.collect()
        _free_cache()
        self._lock.notify_all()

    def unload_now(self, name: str) -> None:
        """Ollama's empty request with keep_alive 0: unload once idle."""
        key = self.find(name).model_id
        with self._lock:
            entry = self._loaded.get(key)
            if entry is not None:
                entry.expires_at = time.time()

    def _reap(self) -> None:
        while not self._stopping.wait(REAP_S):
            now = time.time()
            with self._lock:
                for entry in list(self._loaded.values()):
                    expired = entry.expires_at is not None and entry.expires_at <= now
                    if expired and entry.idle:
                        self._unload(entry, "keep_alive ran out")

    # -- the server's side -----------------------------------------------------------------
    def start(self) -> None:
        self._reaper.start()

    def stop(self) -> None:
        self._stopping.set()
        with self._lock:
            for entry in list(self._loaded.values()):
                entry.backend.worker.stop()
            self._loaded.clear()

    def loaded(self) -> list[Loaded]:
        """The loaded models, most recently used first."""
        with self._lock:
            return list(reversed(self._loaded.values()))

    # -- what the routes ask (serve.served.Served) ----------------------------------------
    def check(self, name: str) -> None:
        self.find(name)

    def unload(self, name: str) -> None:
        self.unload_now(name)

    def _entries(self) -> dict[str, Loaded]:
        with self._lock:
            return dict(self._loaded)

    def cards(self) -> list[dict[str, Any]]:
        from macspec.serve.served import model_card

        return [model_card(m.model_id) for m in self.models]

    def tags(self) -> list[dict[str, Any]]:
        from macspec.serve import pool_listing

        loaded = {key: entry.backend for key, entry in self._entries().items()}
        return [pool_listing.tag(m, loaded.get(m.model_id)) for m in self.models]

    def running(self) -> list[dict[str, Any]]:
        from macspec.serve import pool_listing

        return [
            pool_listing.running(entry.servable, entry.backend, entry.expires_at)
            for entry in self.loaded()
        ]

    def show(self, name: str) -> dict[str, Any]:
        from macspec.serve import pool_listing
        from macspec.serve.ollama_models import described

        servable = self.find(name)
        entry = self._entries().get(servable.model_id)
        if entry is not None:
            return described(entry.backend).show()
        return pool_listing.show(servable)

    def workers(self) -> list:
        return [entry.backend.worker for entry in self.loaded()]


def _free_cache() -> None:
    """Hand an unloaded model's buffers back (MLX keeps freed buffers for reuse)."""
    import mlx.core as mx

    mx.clear_cache()
