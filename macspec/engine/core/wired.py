"""Wired memory while generating, as mlx-lm's `wired_limit` sets it.

On Metal, the wired limit is raised to the device's recommended working set so the weights are
not paged out between passes; it is restored after a synchronize (no async evaluation may still
be running when it changes), however the generation ends. Elsewhere (the CPU backend) the
device reports no recommended size and nothing changes.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import mlx.core as mx
from mlx_lm.utils import maybe_set_recommended_wired_limit


def recommended_working_set() -> int | None:
    """Bytes the GPU may wire (Metal's recommendedMaxWorkingSetSize); None off Metal."""
    return mx.device_info().get("max_recommended_working_set_size")


@contextmanager
def wired_limit() -> Iterator[None]:
    old = maybe_set_recommended_wired_limit()
    try:
        yield
    finally:
        if old is not None:
            mx.synchronize()
            mx.set_wired_limit(old)
