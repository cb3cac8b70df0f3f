"""MLX's per-thread streams, released by the thread that made them.

Since MLX 0.32 nothing tears a thread's streams down for it: a thread that ran MLX work and
will run no more (the server's engine thread when the server stops, the main thread at exit)
calls `release_streams`, or the process can abort at exit ("terminate called without an active
exception"); ml-explore/mlx#4327, and mlx-vlm does the same. Not for a thread whose arrays live
on unevaluated (the chat's answer and load workers hand their models and caches to the next
thread): an array whose stream is gone can never be evaluated.
"""

from __future__ import annotations

import mlx.core as mx


def release_streams() -> None:
    """Finish this thread's queued MLX work, then destroy its streams (a later MLX call in the
    thread makes new ones). Arrays already evaluated stay valid."""
    mx.synchronize()
    clear = getattr(mx, "clear_streams", None)  # older MLX releases cleaned up by themselves
    if clear is not None:
        clear()
