"""The `macspec` command line: one module per group of commands, all on one typer app."""

from macspec.cli import (  # noqa: F401  (registers its commands on the app)
    bench,
    chat,
    models,
    run,
    serve,
    tune,
)
from macspec.cli.app import app, main

__all__ = ["app", "main"]
