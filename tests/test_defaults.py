"""One set of defaults (macspec/cli/options.py): run, chat and serve answer with the same
sampling and the same --max-tokens unless told otherwise; the commands that differ say why in
their help."""

from __future__ import annotations

import typer.main

import macspec.cli  # noqa: F401 - registers every command on the app
from macspec.cli.app import app
from macspec.cli.options import DEFAULT_MAX_TOKENS

SHARED = ("max_tokens", "temp", "top_p", "top_k", "min_p")


def defaults_of(command: str) -> dict:
    group = typer.main.get_command(app)
    return {param.name: param.default for param in group.commands[command].params}


def test_run_chat_and_serve_share_their_defaults():
    run, chat, serve = (defaults_of(name) for name in ("run", "chat", "serve"))
    for name in SHARED:
        assert run[name] == chat[name] == serve[name], name
    assert run["max_tokens"] == DEFAULT_MAX_TOKENS and run["temp"] == 0.0


def test_where_a_command_differs_its_help_says_why():
    group = typer.main.get_command(app)
    helps = {
        command: {p.name: p.help or "" for p in group.commands[command].params}
        for command in ("run", "serve", "bench")
    }
    assert "serve's is auto" in helps["run"]["draft"]
    assert "run and chat take" in helps["serve"]["draft"]
    assert "greedy" in helps["bench"]["temp"] and "512" in helps["bench"]["max_tokens"]
