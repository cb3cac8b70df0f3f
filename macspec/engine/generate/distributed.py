"""Speculation over a target sharded across machines (`mlx.distributed`, started by mlx.launch).

Every rank runs the same engine loop on the same ids: the target's sharded passes all-reduce
inside themselves, so each rank gets the same logits, and greedy verdicts, seeded picks, stops
and the end of the answer follow from them alike. A replicated draft guesses alike on every rank
(same weights, same ids, same keys). What could still differ is made to agree here:

- the draft length (and with `--draft auto`, the drafter): the policy times passes, and timings
  differ per rank. Rank 0's policy decides; each cycle one tiny all_gather shares its choice;
- that exchange also carries a checksum of the ids each rank has committed, so ranks that drift
  apart (a draft computed differently on another chip) stop with an error at the next cycle;
- a sampled run without a seed samples with rank 0's fresh seed;
- a cancel (a server's client leaving) is rank 0's, shared after every token;
- a lost peer: MLX's backends raise at the next collective; that becomes `PeerLost`, one line;
- a stuck peer (alive, not answering): `Watchdog` ends the process when no pass or exchange
  has started for its timeout.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

import mlx.core as mx

from macspec.engine.core.events import Done, Event, Token
from macspec.engine.core.sampling import SamplingParams, choose_sampler
from macspec.engine.policy.choice import DrafterChoice
from macspec.engine.policy.length import DraftPolicy
from macspec.errors import MacspecError

LAUNCH_VARIABLES = (
    "MLX_RANK",  # mlx.launch: ring and jaccl
    "MLX_HOSTFILE",  # ring, started by hand
    "MLX_JACCL_COORDINATOR",  # jaccl
    "OMPI_COMM_WORLD_SIZE",  # mpirun
    "MLX_WORLD_SIZE",  # nccl
)
"""Set by launchers; without any of them a process is alone and MLX's backends are not probed."""
MODULUS = 2**31 - 1
"""Checksums are kept below this, so they travel as int32."""
TIMEOUT_VARIABLE = "MACSPEC_DIST_TIMEOUT"
DEFAULT_TIMEOUT_S = 120.0
"""Seconds without a new pass or exchange before a rank gives up on the others (a prompt chunk
of 2048 ids through a 400B model takes seconds; a stuck peer would block forever)."""


class PeerLost(MacspecError):
    """Another rank is gone: it failed, was stopped, or the network between them broke."""


class Diverged(MacspecError):
    """Ranks that must agree did not (different ids, configs or decisions)."""


def world() -> mx.distributed.Group | None:
    """The group this process belongs to when a launcher started several; None when alone."""
    if not any(os.environ.get(name) for name in LAUNCH_VARIABLES):
        return None
    hostfile = os.environ.get("MLX_HOSTFILE")
    if hostfile and not os.path.isfile(hostfile):
        raise MacspecError(f"the hostfile {hostfile} (MLX_HOSTFILE) does not exist")
    try:
        group = mx.distributed.init()
    except RuntimeError as exc:  # a malformed hostfile, a peer that never came up
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise MacspecError(f"cannot join the other ranks (mlx.distributed): {reason}") from None
    return group if group.size() > 1 else None


def is_peer_failure(exc: BaseException) -> bool:
    """Whether an MLX error is a collective that lost its peers ('[ring] connection to a peer
    was lost', the same from jaccl, mpi or nccl)."""
    backends = ("[ring]", "[jaccl]", "[mpi]", "[nccl]")
    return isinstance(exc, RuntimeError) and str(exc).lstrip().startswith(backends)


def peer_lost(exc: BaseException, group: mx.distributed.Group) -> PeerLost:
    reason = str(exc).strip().splitlines()[0]
    return PeerLost(
        f"rank {group.rank()} lost the other ranks of its group of {group.size()} "
        f"({reason}): one of them failed or was stopped (its own message, if any, is above), "
        "or the network between them broke"
    )


def checksum(ids: Sequence[int], start: int = 0) -> int:
    """A rolling hash of ids, below MODULUS; `start` continues an earlier one."""
    value = start
    for i in ids:
        value = (value * 1_000_003 + int(i) + 1) % MODULUS
    return value


class Exchange:
    """The small collectives the ranks agree through, each a few int32 values, on the default
    stream (in order with the target's own all-reduces). Every call kicks the watchdog."""

    def __init__(self, group: mx.distributed.Group, watchdog: Watchdog | None = None):
        self.group = group
        self.rank, self.size = group.rank(), group.size()
        self.watchdog = watchdog
        self.count = 0
        """Exchanges made so far (each one all_gather)."""

    def gather(self, values: Sequence[int], waiting: bool = False) -> list[list[int]]:
        """Every rank's values, by rank. `waiting`: the others may take as long as they like
        (a server waiting for its next request): the watchdog is disarmed meanwhile."""
        if self.watchdog is not None:
            if waiting:
                self.watchdog.disarm()
            else:
                self.watchdog.kick()
        self.count += 1
        mine = mx.array([int(v) for v in values], mx.int32)
        try:
            every = mx.distributed.all_gather(mine, group=self.group).tolist()
        except RuntimeError as exc:
            if is_peer_failure(exc):
                raise peer_lost(exc, self.group) from None
            raise
        n = len(values)
        return [every[r * n : (r + 1) * n] for r in range(self.size)]

    def from_rank0(self, values: Sequence[int], waiting: bool = False) -> list[int]:
        """Rank 0's values, on every rank (others' are ignored)."""
        return self.gather(values, waiting)[0]

    def agree(self, what: str, value: int) -> None:
        """Raise Diverged unless every rank holds the same value."""
        values = [row[0] for row in self.gather([value])]
        if len(set(values)) > 1:
            raise Diverged(f"the ranks disagree on {what}: {values} by rank")


class AgreedPolicy(DraftPolicy):
    """A draft-length policy whose choices rank 0 makes for every rank.

    Each rank's own policy still runs (it learns from the same cycles), but only rank 0's
    choice counts: k, and for a `DrafterChoice` which drafter. The exchange that shares it also
    compares each rank's checksum of the ids committed so far (`committed`, kept up to date by
    `DistributedEngine`).
    """

    def __init__(self, inner: DraftPolicy, exchange: Exchange):
        self.inner = inner
        self.exchange = exchange
        self.committed = 0
        """Checksum of the prompt and the tokens delivered so far."""
        self.overruled = 0
        """Cycles where this rank's own policy chose otherwise than rank 0's."""
        self.choices: list[int] = []
        """The agreed draft length of every cycle (plain steps included: 0), for tests."""
        self.choice = inner if isinstance(inner, DrafterChoice) else None
        """The inner policy when it also picks the drafter of each cycle (`--draft auto`)."""
        self._names = list(self.choice.drafters) if self.choice is not None else []

    # -- the inner policy's figures and hooks, as they are ------------------------------------
    @property
    def confidence_floor(self) -> float | None:
        return self.inner.confidence_floor

    @property
    def wants_timings(self) -> bool:
        return self.inner.wants_timings

    @property
    def last_choice(self) -> int:
        return self.inner.last_choice

    @property
    def reason(self) -> str | None:
        return self.inner.reason

    def price_note(self) -> str | None:
        return self.inner.price_note()

    @property
    def tree_note(self) -> str | None:
        return self.inner.tree_note

    def bind(self, engine: Any) -> None:
        self.inner.bind(engine)

    def begin(self, params: SamplingParams) -> None:
        self.inner.begin(params)

    def tree_plan(self, k: int, context: list[int], greedy_or_coupled: bool) -> Any:
        return self.inner.tree_plan(k, context, greedy_or_coupled)

    def draft_length(self) -> int:
        k = self.inner.draft_length()
        choice = self._names.index(self.choice.current) if self.choice is not None else 0
        every = self.exchange.gather([k, choice, self.committed])
        sums = [row[2] for row in every]
        if len(set(sums)) > 1:
            raise Diverged(
                "the ranks committed different tokens (checksums "
                f"{sums} by rank): a draft that computes differently on different machines, "
                "or different model files; check that every host has the same models and macspec"
            )
        agreed_k, agreed_choice = every[0][0], every[0][1]
        if (k, choice) != (agreed_k, agreed_choice):
            self.overruled += 1
            if self._names:  # DrafterChoice: the drafter of the cycle, and its floor
                name = self._names[agreed_choice]
                self.choice.current = name
                self.choice.confidence_floor = self.choice.policies[name].confidence_floor
        self.choices.append(agreed_k)
        return agreed_k

    def observe(self, cycle) -> None:
        self.inner.observe(cycle)


class DistributedEngine:
    """An Engine whose generations agree across the ranks of `group` (see the module doc).

    Everything else is the engine's own: `drafter`, `target`, `tokenizer`, `cached_models()`.
    """

    def __init__(self, engine, group: mx.distributed.Group, watchdog: Watchdog | None = None):
        self.engine = engine
        self.group = group
        self.rank, self.size = group.rank(), group.size()
        self.watchdog = watchdog
        self.exchange = Exchange(group, watchdog)
        self.agreed: AgreedPolicy | None = None
        if engine.drafter is not None:
            self.agreed = AgreedPolicy(engine.policy, self.exchange)
            engine.policy = self.agreed
        if watchdog is not None:  # every target pass (prefill chunks included) shows progress
            forward = engine.target.forward

            def kicked_forward(ids):
                watchdog.kick()
                return forward(ids)

            engine.target.forward = kicked_forward

    def __getattr__(self, name: str):
        return getattr(self.engine, name)

    @property
    def policy(self):
        return self.engine.policy

    def generate(
        self,
        prompt: Sequence[int],
        config=None,
        cancelled: Callable[[], bool] | None = None,
    ) -> Iterator[Event]:
        """The engine's events, the same on every rank. Every rank must pass a `cancelled` or
        none: with one, rank 0's answer is shared after every token."""
        from macspec.engine.generate.loop import GenerationConfig

        config = config if config is not None else GenerationConfig()
        prompt = [int(t) for t in prompt]
        config = self._agree_on_start(prompt, config)
        if self.agreed is not None:
            self.agreed.committed = checksum(prompt)
        agreed_cancel = None
        if cancelled is not None:

            def agreed_cancel() -> bool:
                return bool(self.exchange.from_rank0([bool(cancelled())])[0])

        events = self.engine.generate(prompt, config, agreed_cancel)
        try:
            for event in events:
                if self.watchdog is not None:
                    self.watchdog.kick()
                if isinstance(event, Token) and self.agreed is not None:
                    self.agreed.committed = checksum([event.id], self.agreed.committed)
                yield event
                if isinstance(event, Done):
                    return
        except RuntimeError as exc:
            if is_peer_failure(exc):
                raise peer_lost(exc, self.group) from None
            raise
        finally:
            events.close()

    def _agree_on_start(self, prompt: list[int], config):
        """Same prompt and settings on every rank; a sampled run without a seed gets rank 0's."""
        if not config.sampling.greedy and config.seed is None:
            # Keep the sampler the user gets without a seed (rejection), with rank 0's seed.
            sampler = choose_sampler(config.sampler, None)
            seed = self.exchange.from_rank0([secrets.randbits(31)])[0]
            config = replace(config, seed=seed, sampler=sampler)
        settings = zlib.crc32(repr(config).encode()) & 0x7FFFFFFF
        self.exchange.agree("the prompt", checksum(prompt))
        self.exchange.agree("the generation settings", settings)
        return config


class Watchdog:
    """Ends a stuck process: when `kick` has not been called for `timeout` seconds while armed,
    `on_expire(seconds)` runs on the watchdog's thread (it should print one line and exit).

    MLX releases the GIL while it waits on a collective, so this thread runs even when the main
    thread is blocked on a peer that no longer answers.
    """

    def __init__(self, on_expire: Callable[[float], None], timeout: float | None = None):
        if timeout is None:
            try:
                timeout = float(os.environ.get(TIMEOUT_VARIABLE) or DEFAULT_TIMEOUT_S)
            except ValueError:
                raise MacspecError(f"{TIMEOUT_VARIABLE} must be a number of seconds") from None
        if not timeout > 0:
            raise MacspecError(f"{TIMEOUT_VARIABLE} must be positive, got {timeout}")
        self.timeout = timeout
        self.on_expire = on_expire
        self._last = time.monotonic()
        self._armed = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="macspec-watchdog", daemon=True)

    def start(self) -> Watchdog:
        self._thread.start()
        return self

    def kick(self) -> None:
        self._last = time.monotonic()
        self._armed = True

    def disarm(self) -> None:
        """Nothing to watch until the next kick (waiting on the user, not on a peer)."""
        self._armed = False

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        step = min(1.0, self.timeout / 4)
        while not self._stop.wait(step):
            idle = time.monotonic() - self._last
            if self._armed and idle > self.timeout:
                self.on_expire(idle)
                return
