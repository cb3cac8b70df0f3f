"""The `macspec` command line: one module per group of commands, all on one typer app.

`main` is the console entry point (and what `python -m macspec` runs). A Ctrl-C while the
program starts, as typer, rich and the commands load here, is caught like any other: one
line and exit 130, never a KeyboardInterrupt traceback.
"""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Sequence

from macspec.errors import EXIT_INTERRUPTED

try:
    from macspec.cli import bench, cache, chat, models, run, serve, tune  # noqa: F401  (registers them)
    from macspec.cli.app import app, run_main

    _STARTED = True
except KeyboardInterrupt:  # the imports were cut short; `main` says so
    _STARTED = False


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point: runs the app, printing user errors as one line on stderr, exit 2."""
    open_closed_standard_streams()
    if not _STARTED:
        print("\nmacspec: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    try:
        return run_main(argv)
    except KeyboardInterrupt:  # between the commands' own handling and here
        print("\nmacspec: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def open_closed_standard_streams() -> None:
    """Give stdin, stdout or stderr that the caller closed (`<&-`, `>&-`) /dev/null instead.
    Otherwise the next file opened takes the free number: a model's weights opened as fd 0
    fail to load in MLX, and a closed stdout is a traceback at the first write. Reading then
    gives nothing and writing goes nowhere, as for a daemon."""
    for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        if getattr(sys, name) is not None:  # open when Python started
            continue
        try:
            os.fstat(fd)
        except OSError:  # still free: /dev/null takes the number
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
            target: int | str = fd
        else:  # a file opened since holds the number: leave it be
            target = os.devnull
        errors = "backslashreplace" if name == "stderr" else "strict"  # as Python's own stderr
        stream = open(target, mode, encoding="utf-8", errors=errors, closefd=target != fd)  # noqa: SIM115
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def release_main_streams() -> None:
    """At exit: the main thread's MLX streams, if a command used MLX (see engine/core/streams.py).
    Not under a launcher: a rank that lost its peers may hold a collective that never ends,
    and waiting for it would hang the exit."""
    if "mlx.core" not in sys.modules:
        return
    from macspec.cli.ranks import launched
    from macspec.engine.core.streams import release_streams

    if launched():
        return
    try:
        release_streams()
    except Exception:  # noqa: BLE001 - the process is ending: no traceback for a cleanup
        pass


atexit.register(release_main_streams)

__all__ = ["app", "main"]
