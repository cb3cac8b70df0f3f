"""Block files are written on a thread of their own, so no answer waits for the disk.

The engine's thread hands over evaluated arrays (a block's copy, not the live cache); this
thread only reads their memory, hashes and writes it. After a run of writes the store is cut
back to its size bound. What is still queued when the process ends is written before it exits
(`drain`, registered with atexit by the tier); a process killed meanwhile leaves no block that
loads (blockfile.py).
"""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx

from macspec.prefix.store import DiskStore

log = logging.getLogger("macspec.prefix")

PENDING_LIMIT = 1 << 30
"""Bytes queued for writing beyond which the engine's thread waits (memory stays bounded
when the disk is slower than prefill)."""


@dataclass(frozen=True)
class BlockWrite:
    path: Path
    arrays: dict[str, mx.array]
    meta: dict[str, str]
    depth: int
    nbytes: int


class Writer:
    """One background thread writing blocks to a store, in order."""

    def __init__(self, store: DiskStore, pending_limit: int = PENDING_LIMIT):
        self.store = store
        self.pending_limit = pending_limit
        self.written_bytes = 0
        """Bytes this process wrote (files that were there already count nothing)."""
        self._queue: queue.Queue[BlockWrite | None] = queue.Queue()
        self._pending = 0
        self._wrote_since_evict = True  # the folder may be over the bound from the start
        self._failed: set[str] = set()
        self._idle = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="macspec-prompt-cache", daemon=True)
        self._thread.start()

    def submit(self, write: BlockWrite) -> None:
        """Queue a block (waits while too much is queued already)."""
        with self._idle:
            while self._pending > self.pending_limit:
                self._idle.wait(0.1)
            self._pending += write.nbytes
        self._queue.put(write)

    def drain(self, timeout: float | None = 120.0) -> bool:
        """Wait until everything queued is written (and the store fits its bound)."""
        try:
            with self._idle:
                return self._idle.wait_for(
                    lambda: self._pending == 0 and self._queue.empty(), timeout
                )
        except KeyboardInterrupt:  # a second Ctrl-C at exit: what is unwritten is lost, safely
            return False

    @property
    def pending_bytes(self) -> int:
        return self._pending

    def _run(self) -> None:
        while True:
            try:
                write = self._queue.get(timeout=1.0 if self._wrote_since_evict else None)
            except queue.Empty:
                write = None
            if write is not None:
                self._write(write)
            if self._queue.empty() and self._wrote_since_evict:
                self._evict()
            if write is not None:  # done only now: `drain` returns with the bound kept
                with self._idle:
                    self._pending -= write.nbytes
                    self._idle.notify_all()

    def _write(self, write: BlockWrite) -> None:
        try:
            written = self.store.save(write.path, write.arrays, write.meta, write.depth)
            self.written_bytes += written
            self._wrote_since_evict = self._wrote_since_evict or written > 0
        except Exception as exc:  # noqa: BLE001 - a block not written is a block recomputed
            reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
            if reason not in self._failed:  # once per reason, not once per block
                self._failed.add(reason)
                log.warning("prompt cache: cannot write %s: %s", write.path.parent, reason)

    def _evict(self) -> None:
        self._wrote_since_evict = False
        try:
            self.store.evict()
        except Exception as exc:  # noqa: BLE001 - the next run of writes tries again
            log.warning("prompt cache: cannot trim %s: %s", self.store.root, exc)
