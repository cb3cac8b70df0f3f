"""Continuous batching: up to `max_batch` requests decode together on one BatchEngine.

The worker thread loops: it admits waiting requests while the batch has room (each starts
from the saved state that shares most of its prompt), prefills a joining request's prompt one
chunk at a time between the running rows' cycles (so running answers keep streaming), runs
one batched cycle for every decoding row, and hands each row's events to its request. A
request whose client went away leaves the batch at once; a finished one leaves with its
caches saved for the next turn of its conversation.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import replace

from macspec.engine.batch.engine import BatchEngine, Row
from macspec.engine.caches.cached import SavedCache
from macspec.engine.core.events import Cycle, Done, Source, Token
from macspec.engine.core.streams import release_streams
from macspec.models.reasoning import ReasoningSplitter
from macspec.prefix.tier import tier_of
from macspec.serve.budget import CLOSING, joined
from macspec.serve.prompt_cache import shared_prefix
from macspec.serve.worker import Failed, Job, Worker

log = logging.getLogger("macspec.serve")


class SavedStates:
    """Finished rows' caches by the ids they hold, least recently used first."""

    def __init__(self, size: int):
        self.size = max(0, size)
        self.entries: OrderedDict[tuple[int, ...], list[SavedCache]] = OrderedDict()

    def best(self, prompt: list[int]) -> list[SavedCache] | None:
        """The state sharing the longest prefix with `prompt` (None: none shares any)."""
        scored = [(shared_prefix(key, prompt), key) for key in self.entries]
        shared, key = max(scored, default=(0, None))
        if not shared:
            return None
        self.entries.move_to_end(key)
        return self.entries[key]

    def add(self, saved: list[SavedCache] | None) -> None:
        if not saved or not saved[0].tokens or self.size == 0:
            return
        tokens = saved[0].tokens
        for key in list(self.entries):
            if tokens[: len(key)] == key:  # this one extends a saved state: replace it
                del self.entries[key]
        self.entries[tokens] = saved
        while len(self.entries) > self.size:
            self.entries.popitem(last=False)


class BudgetWatch:
    """A row's reasoning, counted token by token, against its thinking budget."""

    def __init__(self, job: Job):
        self.budget = job.budget
        self.splitter = ReasoningSplitter(job.budget.inside)
        self.spent = 0
        self.seen = 0
        """Characters of the row's text already fed (a new row starts again at 0)."""

    def check(self, answer) -> bool:
        """After each token of the row's answer: count it, and whether the budget is spent."""
        text = answer.detokenizer.text
        self.spent += self.splitter.in_reasoning
        self.splitter.feed(text[self.seen :])
        self.seen = len(text)
        return self.over

    @property
    def over(self) -> bool:
        return self.splitter.in_reasoning and self.spent >= self.budget.tokens


class BatchWorker(Worker):
    """A Worker whose thread decodes up to `max_batch` requests together."""

    def __init__(
        self,
        engine: BatchEngine,
        max_batch: int,
        max_queue: int = 32,
        prompt_cache_size: int = 4,
    ):
        super().__init__(engine, max_queue, prompt_cache_size=0)
        self.capacity = max_batch
        self.states = SavedStates(prompt_cache_size + max_batch)
        self.rows: dict[Job, Row] = {}
        """The requests in the batch or joining it, and their rows."""
        self.watches: dict[Job, BudgetWatch] = {}
        self.firsts: dict[Job, Done] = {}
        """A budgeted request's first part, once its reasoning was closed."""

    @property
    def generating(self) -> int:
        return len(self.rows)

    @property
    def busy(self) -> bool:
        return bool(self.rows)

    def _generating(self) -> list[Job]:
        return list(self.rows)

    # -- the worker thread -----------------------------------------------------------------
    def _run(self) -> None:
        try:
            while self._cycle():
                pass
        finally:
            release_streams()

    def _cycle(self) -> bool:
        """One turn of the loop; False once the server stops and nothing is left to end."""
        with self._lock:
            while not self._waiting and not self.rows and not self._stopping:
                self._lock.wait()
            if self._stopping and not self.rows:
                return False
            arriving = []
            while self._waiting and len(self.rows) + len(arriving) < self.capacity:
                arriving.append(self._waiting.popleft())
        for job in arriving:
            self._admit(job)
        self._drop_gone()
        engine: BatchEngine = self.engine
        try:
            if engine.joining:
                joining = engine.joining[0]
                job = self._job_of(joining)
                try:
                    engine.prefill_step(joining)
                except Exception as exc:  # this request's prompt only
                    self._fail(job, exc)
            if engine.rows:
                engine.step()
        except Exception as exc:  # a failed batched pass fails every row in it
            in_batch = [job for job, row in self.rows.items() if row in engine.rows]
            engine.drop_rows()
            for job in in_batch:
                self._fail(job, exc)
        self._deliver()
        return True

    def _job_of(self, row: Row) -> Job:
        return next(job for job, r in self.rows.items() if r is row)

    def _admit(self, job: Job, prompt: list[int] | None = None, config=None) -> None:
        """Start a request's row from the saved state that shares most of its prompt."""
        prompt = job.prompt if prompt is None else prompt
        try:
            start = self.states.best(prompt)
            disk = tier_of(self.engine)
            if disk is not None:  # the disk tier, where it holds more of the prompt
                start, started = disk.start_row(prompt, start)
            if job.budget is not None and job not in self.watches:
                self.watches[job] = BudgetWatch(job)
            holder: list[Row] = []
            row = self.engine.admit(
                prompt,
                job.config if config is None else config,
                cancelled=self._cancel_check(job, holder),
                start_from=start[0] if start else None,
            )
            holder.append(row)
            caches = row.drafter.caches() if row.drafter is not None else []
            if start and len(start) > 1 and caches:
                caches[0].load(start[1])
            if disk is not None:
                disk.watch_row(row, started)
        except Exception as exc:
            self._fail(job, exc)
            return
        if job.started_at is None:
            job.started_at = time.perf_counter()
        self.rows[job] = row
        if self._stopping:  # taken from the queue just as the server was told to stop now
            job.cancel_flag.set()

    def _cancel_check(self, job: Job, holder: list[Row]) -> Callable[[], bool]:
        """What ends the row early: its client gone, or its thinking budget spent."""
        watch = self.watches.get(job)
        if watch is None:
            return job.cancelled
        watch.seen = 0
        return lambda: job.cancelled() or watch.check(holder[0].answer)

    def _drop_gone(self) -> None:
        for job, row in list(self.rows.items()):
            if job.cancelled() and row.done is None:
                self.engine.cancel(row)

    def _fail(self, job: Job, exc: BaseException) -> None:
        log.error("a generation failed", exc_info=exc)
        row = self.rows.pop(job, None)
        if row is not None and row.done is None:
            self.engine.cancel(row)
        self.watches.pop(job, None)
        self.firsts.pop(job, None)
        job.post(Failed(exc))

    def _deliver(self) -> None:
        """Hand each row's new events to its request; finished requests leave."""
        for job, row in list(self.rows.items()):
            events, row.events = row.events, []
            for event in events:
                if isinstance(event, Cycle):
                    continue
                if isinstance(event, Done):
                    self._done(job, row, event)
                    break
                if job in self.firsts and not isinstance(event, Token):
                    continue  # the second part's Prefill: the client knows the prompt's
                job.post(event)

    def _done(self, job: Job, row: Row, done: Done) -> None:
        self.states.add(row.saved)
        disk = tier_of(self.engine)
        if disk is not None:  # what came from disk, what was written
            disk.finish_row(row, done.stats)
        del self.rows[job]
        watch = self.watches.get(job)
        closing_due = (
            watch is not None
            and job not in self.firsts
            and done.finish_reason == "cancelled"
            and watch.over
            and not job.cancelled()
        )
        if closing_due:  # the thinking budget is spent: close the reasoning, then answer
            closing = list(self.engine.tokenizer.encode(CLOSING, add_special_tokens=False))
            room = job.config.max_tokens - len(done.tokens) - len(closing)
            if room >= 1:
                self.firsts[job] = done
                job.post(Token(closing[-1], done.tail + CLOSING, Source.TARGET))
                watch.splitter.feed(CLOSING)
                prompt = job.prompt + done.tokens + closing
                self._admit(job, prompt, replace(job.config, max_tokens=room))
                return
        first = self.firsts.pop(job, None)
        self.watches.pop(job, None)
        if first is not None:
            closing = list(self.engine.tokenizer.encode(CLOSING, add_special_tokens=False))
            done = joined(first, closing, done)
        job.done = done
        self.recent.append(done)
        job.post(done)
