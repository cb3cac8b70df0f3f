"""The model pool's rules, over stand-in models (no weights): one load for concurrent requests,
a failed load's error for each waiter and the other models still served, the least recently
used idle model unloaded first, a busy one finishing first, Ollama's keep_alive durations and
its 500 for a model that cannot fit alone, and the names each model answers to."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest

from macspec.errors import MacspecError
from macspec.models.stores.describe import Description
from macspec.models.stores.listing import LocalModel
from macspec.serve.errors import APIError
from macspec.serve.model_names import accepted_names
from macspec.serve.pool import ModelPool, keep_alive_seconds
from macspec.serve.servable import Servable, local_servable

GB = 10**9


class StandInWorker:
    def __init__(self):
        self.generating = 0
        self.waiting = 0
        self.stopped = False

    def start(self) -> None: ...

    def stop(self) -> None:
        assert self.generating == 0, "a model was unloaded while it generated"
        self.stopped = True


def servable(name: str, size: int = GB) -> Servable:
    return Servable(name, name, accepted_names(name), None, None, size)


class Loads:
    """A loader that counts, waits for `gate` and fails for the names in `failing`."""

    def __init__(self, failing: tuple[str, ...] = ()):
        self.count: dict[str, int] = {}
        self.gate = threading.Event()
        self.gate.set()
        self.failing = failing

    def __call__(self, model: Servable):
        self.count[model.model_id] = self.count.get(model.model_id, 0) + 1
        self.gate.wait(10)
        if model.model_id in self.failing:
            raise MacspecError(f"{model.model_id}: the file is damaged")
        return SimpleNamespace(worker=StandInWorker(), model_id=model.model_id)


def loaded_ids(pool: ModelPool) -> list[str]:
    return [entry.servable.model_id for entry in pool.loaded()]


def acquired_together(pool: ModelPool, loads: Loads, name: str, count: int) -> list[Future]:
    """`count` threads asking for `name` while its load is held back, then let go: they all
    wait on the same load."""
    loads.gate.clear()
    with ThreadPoolExecutor(count) as threads:
        futures = [threads.submit(pool.acquire, name) for _ in range(count)]
        time.sleep(0.2)
        loads.gate.set()
    return futures


def test_concurrent_requests_wait_for_one_load():
    loads = Loads()
    pool = ModelPool([servable("a")], loads)
    entries = [f.result(10) for f in acquired_together(pool, loads, "a:latest", 4)]
    assert loads.count == {"a": 1}
    assert len({id(e.backend) for e in entries}) == 1 and entries[0].leases == 4


def test_a_failed_load_answers_every_waiter_and_the_others_still_serve():
    loads = Loads(failing=("bad",))
    pool = ModelPool([servable("bad"), servable("good")], loads)
    errors = [f.exception(10) for f in acquired_together(pool, loads, "bad", 3)]
    assert loads.count == {"bad": 1}
    assert all(isinstance(e, APIError) and e.status == 500 for e in errors)
    assert all("the file is damaged" in e.message for e in errors)
    assert pool.acquire("good").backend.model_id == "good"
    assert loaded_ids(pool) == ["good"]


def test_the_least_recently_used_idle_model_unloads_first():
    pool = ModelPool([servable(n) for n in "abc"], Loads(), max_loaded=2)
    for name in ("a", "b", "a"):
        pool.release(pool.acquire(name), None)
    pool.release(pool.acquire("c"), None)  # b was used least recently
    assert loaded_ids(pool) == ["c", "a"]


def test_a_busy_model_finishes_before_it_unloads():
    pool = ModelPool([servable("a"), servable("b")], Loads(), budget_bytes=GB + GB // 2)
    a = pool.acquire("a")
    pool.release(a, None)
    a.backend.worker.generating = 1  # its answer streams on
    wanted = ThreadPoolExecutor(1).submit(pool.acquire, "b")
    time.sleep(0.5)
    assert not wanted.done() and loaded_ids(pool) == ["a"]
    a.backend.worker.generating = 0
    assert wanted.result(10).servable.model_id == "b"
    assert a.backend is None and loaded_ids(pool) == ["b"]


def test_keep_alive_runs_out_only_when_idle():
    pool = ModelPool([servable("a")], Loads())
    pool.start()
    try:
        entry = pool.acquire("a")
        worker = entry.backend.worker
        pool.release(entry, 0.0)
        deadline = time.monotonic() + 5
        while pool.loaded() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pool.loaded() == [] and worker.stopped
    finally:
        pool.stop()


def test_a_model_that_cannot_fit_alone_is_ollamas_500():
    pool = ModelPool([servable("big", 3 * GB)], Loads(), budget_bytes=2 * GB)
    with pytest.raises(APIError) as raised:
        pool.acquire("big")
    assert raised.value.status == 500
    assert raised.value.message == (
        "model requires more system memory (2.8 GiB) than is available (1.9 GiB)"
    )


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("5m", 300.0), ("30s", 30.0), ("1h", 3600.0), (0, 0.0), ("0", 0.0), (-1, None),
     ("-1m", None), (90, 90.0), ("250ms", 0.25)],
)  # fmt: skip
def test_keep_alive_is_read_as_ollama_reads_it(value, seconds):
    assert keep_alive_seconds(value) == seconds


def test_a_keep_alive_that_is_no_duration_is_a_400():
    with pytest.raises(APIError) as raised:
        keep_alive_seconds("soon")
    assert raised.value.status == 400 and raised.value.param == "keep_alive"


def lm_studio_model(name: str) -> Servable:
    about = Description("gguf", GB, "Q4_K_M", "llama", 4096, None, None)
    model = LocalModel(f"lmstudio:{name}", "lmstudio", Path(f"/store/{name}/m.gguf"), about)
    found = local_servable(model)
    assert found is not None
    return found


def test_an_lm_studio_model_answers_to_lm_studios_own_name():
    pool = ModelPool([lm_studio_model("pub/repo")], Loads())
    assert pool.find("pub/repo") is pool.find("lmstudio:pub/repo")


def test_a_models_own_id_wins_over_another_models_alias():
    """An HF-cache repo `pub/repo` and LM Studio's `lmstudio:pub/repo`: each name one model."""
    studio, cached = lm_studio_model("pub/repo"), servable("pub/repo")
    for order in ([studio, cached], [cached, studio]):
        pool = ModelPool(order, Loads())
        assert pool.find("pub/repo") is cached
        assert pool.find("lmstudio:pub/repo") is studio


def test_an_unknown_model_is_openais_404_naming_what_is_served():
    pool = ModelPool([servable(n) for n in "abc"], Loads())
    with pytest.raises(APIError) as raised:
        pool.find("nope")
    assert raised.value.status == 404
    assert raised.value.message == "The model 'nope' does not exist (this server has: a, b, c)"
