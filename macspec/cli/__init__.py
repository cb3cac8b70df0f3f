"""The `macspec` command line: one module per group of commands, all on one typer app.

`main` is the console entry point (and what `python -m macspec` runs). A Ctrl-C while the
program starts, as typer, rich and the commands load here, is caught like any other: one
line and exit 130, never a KeyboardInterrupt traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

EXIT_INTERRUPTED = 130

try:
    from macspec.cli import bench, chat, models, run, serve, tune  # noqa: F401  (registers them)
    from macspec.cli.app import app, run_main

    _STARTED = True
except KeyboardInterrupt:  # the imports were cut short; `main` says so
    _STARTED = False


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point: runs the app, printing user errors as one line on stderr, exit 2."""
    if not _STARTED:
        print("\nmacspec: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    try:
        return run_main(argv)
    except KeyboardInterrupt:  # between the commands' own handling and here
        print("\nmacspec: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


__all__ = ["app", "main"]
