"""`macspec serve` on every rank of an mlx.distributed group (`mlx.launch -n 2 -- python -m
macspec serve …`): rank 0 serves HTTP, the other ranks follow its generations.

Every pass of a sharded target needs all its ranks. So before rank 0's worker runs a
generation it announces it (the prompt ids and the settings) to the others, which run the same
generation on their slices of the weights and throw the events away. Each rank keeps its own
prompt cache; fed the same prompts and answers, it takes the same decisions on every rank.
Cancels are rank 0's, shared after every token by the distributed engine.

Between requests nobody waits on a peer's pass but on a user: the watchdog is disarmed then, so
an idle server is not taken for a stuck one. When rank 0 stops it says so, and the others end.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict

from macspec.engine.core.config import GenerationConfig
from macspec.engine.core.sampling import SamplingParams
from macspec.engine.generate.distributed import Diverged, PeerLost
from macspec.errors import MacspecError
from macspec.serve.prompt_cache import PromptCache

STOP, GENERATE = 0, 1
"""What rank 0's announcement says: the server stopped, or a generation follows."""
BYTES_PER_VALUE = 3
"""Announcements travel as int32 values (the exchange's type), three bytes in each."""


def encode(prompt: Sequence[int], config: GenerationConfig) -> list[int]:
    """A generation's prompt and settings as int32 values."""
    data = json.dumps({"prompt": [int(t) for t in prompt], "config": asdict(config)}).encode()
    data += b" " * (-len(data) % BYTES_PER_VALUE)  # JSON ignores trailing spaces
    return [
        int.from_bytes(data[i : i + BYTES_PER_VALUE], "little")
        for i in range(0, len(data), BYTES_PER_VALUE)
    ]


def decode(values: Sequence[int]) -> tuple[list[int], GenerationConfig]:
    """`encode`'s prompt and settings back."""
    data = b"".join(int(v).to_bytes(BYTES_PER_VALUE, "little") for v in values)
    message = json.loads(data)
    fields = message["config"]
    sampling, stops = SamplingParams(**fields["sampling"]), tuple(fields["stop_strings"])
    config = GenerationConfig(**{**fields, "sampling": sampling, "stop_strings": stops})
    return message["prompt"], config


class Leader:
    """Rank 0's side: announces each generation before running it, and the end."""

    def __init__(self, engine):
        self.exchange = engine.exchange
        self.watchdog = engine.watchdog

    def announce(self, prompt: Sequence[int], config: GenerationConfig) -> None:
        message = encode(prompt, config)
        self.exchange.from_rank0([GENERATE, len(message)])
        self.exchange.from_rank0(message)

    def idle(self) -> None:
        """The generation is over; the next request may take any time to come."""
        if self.watchdog is not None:
            self.watchdog.disarm()

    def stop(self) -> PeerLost | None:
        """Tell the other ranks the server stopped; a lost rank cannot be told: that error
        (the launcher stops rank 0 when another rank dies), else None."""
        try:
            self.exchange.from_rank0([STOP, 0])
        except PeerLost as exc:
            return exc
        finally:
            self.idle()
        return None


def follow(engine, prompt_cache_size: int) -> int:
    """A rank other than 0: run every generation rank 0 announces, until it stops. Returns
    how many were run."""
    exchange = engine.exchange
    cache = PromptCache(engine, prompt_cache_size)
    followed = 0
    while True:
        kind, size = exchange.from_rank0([STOP, 0], waiting=True)
        if kind == STOP:
            return followed
        prompt, config = decode(exchange.from_rank0([0] * size))
        cache.prepare(prompt)
        followed += 1
        try:
            for _ in engine.generate(prompt, config, cancelled=lambda: False):
                pass
        except (PeerLost, Diverged):
            raise
        except MacspecError:  # refused alike on rank 0, which answered the client with it
            continue
