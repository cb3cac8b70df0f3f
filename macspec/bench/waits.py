"""Counting blocking host-device waits, the stalls that leave an Apple GPU idle.

On Metal the CPU builds the next step's graph while the GPU runs the current one, unless the
code reads a result. A read (`mx.eval`, `.item()`, `.tolist()`) counts as a wait when a model's
forward pass was queued since the last read: it waits on that pass. `mx.async_eval` never waits,
and reading what is already computed is free. The same count is taken around macspec and
mlx-lm alike, so the bench can set them side by side; on a CPU the waits cost next to nothing,
which is why they are counted rather than timed.
"""

from __future__ import annotations

from collections.abc import Iterable

import mlx.core as mx
import mlx.nn as nn


class WaitCounter:
    """A context manager: `count` is the number of waits while it is active."""

    def __init__(self, models: Iterable[nn.Module]):
        self.classes = list(dict.fromkeys(type(m) for m in models if m is not None))
        self.count = 0
        self.at_first_token = 0
        """The count when the first id arrived: the prompt's prefill is not a decoding wait."""
        self._queued = False
        self._saved: list[tuple[object, str, object]] = []

    def first_token(self) -> None:
        self.at_first_token = self.count

    def _patch(self, owner: object, name: str, replacement) -> None:
        self._saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, replacement)

    def __enter__(self) -> WaitCounter:
        def queued(call):
            def forward(model, *args, **kwargs):
                out = call(model, *args, **kwargs)
                self._queued = True
                return out

            return forward

        def reading(read):
            def wrapped(*args, **kwargs):
                if self._queued:
                    self.count += 1
                    self._queued = False
                return read(*args, **kwargs)

            return wrapped

        for cls in self.classes:
            self._patch(cls, "__call__", queued(cls.__call__))
        self._patch(mx, "eval", reading(mx.eval))
        self._patch(mx.array, "item", reading(mx.array.item))
        self._patch(mx.array, "tolist", reading(mx.array.tolist))
        return self

    def __exit__(self, *exc) -> None:
        while self._saved:
            owner, name, original = self._saved.pop()
            setattr(owner, name, original)
