"""What the routes serve: one model loaded at start (`--model`), or the pool of every model on
this Mac (`macspec serve` alone). Both answer the same questions: which backend serves a name
(for one request), what the listings say, which workers run."""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import Any, Protocol

from macspec.serve.backend import Backend
from macspec.serve.worker import Worker


class Served(Protocol):
    def check(self, name: str) -> None:
        """OpenAI's 404 for a name not served."""

    def lease(self, name: str, keep_alive: Any = None) -> Any:
        """An async context manager: the backend serving `name`, for one request."""

    def unload(self, name: str) -> None:
        """Ollama's empty request with keep_alive 0."""

    def cards(self) -> list[dict[str, Any]]:
        """/v1/models' entries."""

    def tags(self) -> list[dict[str, Any]]:
        """/api/tags' entries."""

    def running(self) -> list[dict[str, Any]]:
        """/api/ps' entries."""

    def show(self, name: str) -> dict[str, Any]:
        """/api/show's body (blocking: metadata reads)."""

    def workers(self) -> list[Worker]:
        """The workers of the loaded models."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


def model_card(model_id: str) -> dict[str, Any]:
    return {"id": model_id, "object": "model", "created": 0, "owned_by": "macspec"}


class OneModel:
    """`macspec serve --model M`: the one backend, loaded at start, answering its names."""

    def __init__(self, backend: Backend):
        self.backend = backend

    def check(self, name: str) -> None:
        self.backend.check_model(name)

    @asynccontextmanager
    async def lease(self, name: str, keep_alive: Any = None):
        self.backend.check_model(name)
        yield self.backend

    def unload(self, name: str) -> None:
        """The one model stays loaded for the server's other clients."""

    def cards(self) -> list[dict[str, Any]]:
        return [model_card(self.backend.model_id)]

    def tags(self) -> list[dict[str, Any]]:
        from macspec.serve.ollama_models import described

        return [described(self.backend).listing()]

    def running(self) -> list[dict[str, Any]]:
        from macspec.serve.ollama_models import described

        return [described(self.backend).running()]

    def show(self, name: str) -> dict[str, Any]:
        from macspec.serve.ollama_models import described

        return described(self.backend).show()

    def workers(self) -> list[Worker]:
        return [self.backend.worker]

    def start(self) -> None:
        self.backend.worker.start()

    def stop(self) -> None:
        self.backend.worker.stop()
