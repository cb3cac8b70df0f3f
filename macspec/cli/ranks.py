"""A command on every rank of an mlx.distributed group (`mlx.launch -n 2 -- python -m macspec run`).

`ranks()` finds the group (None when the process is alone) and, for the command's duration:
ranks other than 0 write nothing (stdout and stderr go to /dev/null; their own errors still
print, marked with their rank); a watchdog ends a rank whose peers stopped answering; SIGTERM
(mlx.launch stopping the others when one rank fails) becomes a one-line error. A lost peer is
one line on rank 0 and silence elsewhere: the rank that failed printed its own reason.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from macspec.errors import EXIT_INTERRUPTED, EXIT_USER_ERROR, MacspecError, QuietExit

SUPPORTED = ("run", "bench", "serve")
"""Commands that run on every rank of a group; the others refuse a launcher."""


class Stopped(MacspecError):
    """SIGTERM: mlx.launch stops every rank once one has failed, or the user stopped it."""


@dataclass
class Ranks:
    """This process's place in the group, and the watchdog its passes kick."""

    group: object
    """The mlx.distributed group."""
    watchdog: object
    """macspec.engine.generate.distributed.Watchdog."""

    @property
    def rank(self) -> int:
        return self.group.rank()

    @property
    def size(self) -> int:
        return self.group.size()


def launched() -> bool:
    """Whether a launcher started this process as one of several (cheap: environment only)."""
    from macspec.engine.generate.distributed import (
        LAUNCH_VARIABLES,
    )  # engine/ imports MLX: only here

    return any(os.environ.get(name) for name in LAUNCH_VARIABLES)


def refuse_under_launch(command: str) -> None:
    """Commands that only make sense on one machine refuse a launcher in one line."""
    if launched():
        raise MacspecError(
            f"macspec {command} runs on one machine; across machines (mlx.launch) use "
            f"macspec {', '.join(SUPPORTED)}"
        )


@contextmanager
def ranks() -> Iterator[Ranks | None]:
    """The group when several ranks run this command, else None (nothing changes then)."""
    from macspec.engine.generate.distributed import (
        PeerLost,
        Watchdog,
        is_peer_failure,
        peer_lost,
        world,
    )

    group = world() if launched() else None
    if group is None:
        yield None
        return
    rank = group.rank()
    prefix = f"rank {rank}: " if rank else ""
    real_stderr = sys.stderr
    ending = False

    def expire(idle: float) -> None:
        print(
            f"macspec: {prefix}error: nothing from the other ranks for {idle:.0f} s: one of "
            "them is stuck or the network is down (MACSPEC_DIST_TIMEOUT sets the limit)",
            file=real_stderr,
            flush=True,
        )
        os._exit(EXIT_USER_ERROR)

    def stopped(_signum, _frame) -> None:
        if not ending:  # already on the way out with an error of its own: let it finish
            raise Stopped("stopped by SIGTERM (another rank failed, or the launcher was stopped)")

    watchdog = Watchdog(expire).start()
    previous = signal.signal(signal.SIGTERM, stopped)
    saved = sys.stdout, sys.stderr
    quiet = open(os.devnull, "w") if rank else None  # noqa: SIM115  (closed below)
    if quiet is not None:
        sys.stdout = sys.stderr = quiet
    try:
        try:
            yield Ranks(group, watchdog)
        except RuntimeError as exc:  # a collective outside the engine (loading, the bench)
            if not is_peer_failure(exc):
                raise
            raise peer_lost(exc, group) from None
    except (PeerLost, Stopped, KeyboardInterrupt) as exc:
        ending = True
        if rank:  # rank 0 says it; the rank that failed said why
            code = EXIT_INTERRUPTED if isinstance(exc, KeyboardInterrupt) else EXIT_USER_ERROR
            raise QuietExit(code) from None
        raise
    except MacspecError as exc:
        ending = True
        if rank:
            raise MacspecError(f"rank {rank}: {exc}") from None
        raise
    finally:
        ending = True
        watchdog.stop()
        sys.stdout, sys.stderr = saved
        if quiet is not None:
            quiet.close()
        signal.signal(signal.SIGTERM, previous)
