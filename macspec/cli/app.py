"""The typer app, its entry point and the one-line error convention shared by every command."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import NoReturn

import typer

try:  # typer >= 0.26 vendors its own click; older releases use the click package
    from typer._click.exceptions import ClickException
except ImportError:  # pragma: no cover - depends on the installed typer
    from click.exceptions import ClickException

from macspec.errors import EXIT_INTERRUPTED, EXIT_USER_ERROR, MacspecError, QuietExit

app = typer.Typer(
    name="macspec",
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        from macspec import __version__

        print(f"macspec {__version__}")
        raise typer.Exit()


@app.callback(invoke_without_command=True)
def _root(
    ctx: typer.Context,
    version: bool = typer.Option(
        False, "--version", "-V", callback=_version, is_eager=True, help="Print the version."
    ),
) -> None:
    """Fast local LLM chat on MLX by lossless speculative decoding.

    Start with `macspec run 'a prompt'` (the shipped demo pair, offline) or `macspec chat`;
    `macspec models` lists pairs, `macspec pull NAME` downloads one.
    """
    if ctx.invoked_subcommand is None:  # bare `macspec`: the help, exit 0, as git and uv do
        print(ctx.get_help())
        raise typer.Exit()


METAVARS = {str: "TEXT", int: "N", float: "NUMBER", bool: "BOOL"}
"""What a value looks like in the help, instead of the Python type typer would show."""


def _metavar(param) -> str:
    """TEXT, N, NUMBER, FILE, or an Enum's choices, from the parameter's annotation."""
    import enum
    import typing
    from pathlib import Path

    descriptor = getattr(param, "type_descriptor", None)
    kind = getattr(descriptor, "annotation", str)
    if typing.get_origin(kind) in (list, tuple):  # a repeatable option: one value's look
        kind = (typing.get_args(kind) or (str,))[0]
    if isinstance(kind, type) and issubclass(kind, Path):
        return "FILE"
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return "|".join(str(member.value) for member in kind)
    return METAVARS.get(kind, "TEXT")


def readable_metavars(command) -> None:
    """Give every option and argument without a metavar of its own one that reads as text
    (TEXT, N, NUMBER, FILE) instead of a Python type; an argument shows its name in capitals
    (PROMPT), as git and uv do."""
    for param in getattr(command, "params", []):
        is_option = bool(getattr(param, "opts", None)) and param.opts[0].startswith("-")
        if is_option:
            if param.metavar is None and not getattr(param, "is_flag", False):
                param.metavar = _metavar(param)
            continue
        # typer shows an argument as '{prompt}' in the usage and 'prompt <str>' in the list:
        # PROMPT in both, [PROMPT] when it is optional.
        name = param.metavar = param.metavar or param.name.upper()
        shown = name if param.required else f"[{name}]"
        param._usage_display_name = lambda shown=shown: shown
        param.display_type_rich = lambda ctx=None, **_: ""
    for sub in getattr(command, "commands", {}).values():
        if not sub.short_help and sub.help:  # the whole first sentence, not cut at 45 cells
            sub.short_help = sub.help.strip().split("\n\n")[0].split(". ")[0].rstrip(".")
            sub.short_help = " ".join(sub.short_help.split())
        readable_metavars(sub)


def fail(message: str) -> NoReturn:
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
    readable_metavars(command)
    from macspec.cli.notice import deriving_notice
    from macspec.models.gguf.report import announce_derivations

    try:
        with announce_derivations(deriving_notice):
            result = command.main(args=args, prog_name="macspec", standalone_mode=False)
    except QuietExit as exc:
        return exc.code
    except MacspecError as exc:
        print(f"macspec: error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except typer.Abort:
        print("macspec: aborted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except ClickException as exc:  # bad flags or values, from the argument parser
        print(f"macspec: error: {exc.format_message()}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("\nmacspec: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    if result == EXIT_INTERRUPTED:  # typer turns a Ctrl-C it catches into this, silently
        print("\nmacspec: interrupted", file=sys.stderr)
    return result if isinstance(result, int) else 0
