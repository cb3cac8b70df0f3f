"""The typer app, its entry point and the one-line error convention shared by every command."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

import typer

try:  # typer >= 0.26 vendors its own click; older releases use the click package
    from typer._click.exceptions import ClickException
except ImportError:  # pragma: no cover - depends on the installed typer
    from click.exceptions import ClickException

from macspec.errors import MacspecError, QuietExit

app = typer.Typer(
    name="macspec",
    help="Fast local LLM chat on MLX by lossless speculative decoding.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

EXIT_USER_ERROR = 2


def fail(message: str) -> None:
    """Raise the one-line user error the entry point prints; for use inside commands."""
    raise MacspecError(message)


def run_main(argv: Sequence[str] | None = None) -> int:
    """Run the app, printing user errors as one line on stderr, exit 2 (see `macspec.cli.main`,
    the entry point, which imports this)."""
    # Prompts are short to encode; parallel tokenizers only warn when the process forks later.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    args = list(argv) if argv is not None else sys.argv[1:]
    for arg in args:
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:  # bytes the OS could not decode, kept as surrogates
            raw = arg.encode("utf-8", "surrogateescape")
            print(f"macspec: error: an argument is not valid UTF-8 text: {raw!r}", file=sys.stderr)
            return EXIT_USER_ERROR
    command = typer.main.get_command(app)
    try:
        result = command.main(args=args, prog_name="macspec", standalone_mode=False)
    except QuietExit as exc:
        return exc.code
    except MacspecError as exc:
        print(f"macspec: error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except typer.Abort:
        print("macspec: aborted", file=sys.stderr)
        return 130
    except ClickException as exc:  # bad flags or values, from the argument parser
        print(f"macspec: error: {exc.format_message()}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("\nmacspec: interrupted", file=sys.stderr)
        return 130
    return result if isinstance(result, int) else 0
