"""The command line behaves like its neighbours (git, uv): help with -h, --version, a bare
`macspec` that prints the help and exits 0, metavars that read as text, one name per flag."""

from __future__ import annotations

import re

import pytest

from macspec import __version__
from macspec.cli import main

COMMANDS = [
    ["run"], ["chat"], ["bench"], ["models"], ["pull"], ["rm"], ["serve"], ["tune"],
    ["history"], ["history", "show"],
]  # fmt: skip


def test_bare_macspec_prints_the_help_and_exits_0(capsys):
    assert main([]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("Usage: macspec") and "Commands:" in out and err == ""
    assert "macspec run" in out  # where to start
    commands = out.split("Commands:")[1]
    assert "..." not in commands  # each command's first sentence whole, not cut at 45 cells


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version(capsys, flag):
    assert main([flag]) == 0
    assert capsys.readouterr().out.strip() == f"macspec {__version__}"


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_command_has_help_with_readable_metavars(capsys, command):
    assert main([*command, "-h"]) == 0
    short = capsys.readouterr().out
    assert main([*command, "--help"]) == 0
    assert capsys.readouterr().out == short
    assert short.startswith(f"Usage: macspec {' '.join(command)}")
    # no Python types or braces: TEXT, N, NUMBER, FILE, PROMPT instead
    assert not re.search(r"<(str|int|float|path|list\[str\])>|\{\w+\}|int range", short), short


@pytest.mark.parametrize("command", ["run", "chat", "bench"])
def test_draft_length_has_one_name_everywhere(capsys, command):
    assert main([command, "-h"]) == 0
    assert "-k, --num-draft-tokens" in capsys.readouterr().out


def test_bench_keeps_its_old_k_flag_hidden_and_refuses_both(capsys):
    assert main(["bench", "-h"]) == 0
    assert "--k " not in capsys.readouterr().out
    assert main(["bench", "--k", "2", "-k", "3"]) == 2
    assert "pass -k/--num-draft-tokens once" in capsys.readouterr().err


def test_flags_are_checked_before_anything_loads(capsys):
    assert main(["chat", "-k", "0"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        "macspec: error: --num-draft-tokens must be >= 1 (or 'auto'), got 0"
    ]
    assert main(["run", "--no-draft", "--draft", "lookup", "hi"]) == 2
    assert "contradict each other" in capsys.readouterr().err
    assert main(["run", "-k", "many", "hi"]) == 2
    assert "loading" not in capsys.readouterr().err


def test_an_answer_that_ends_at_once_says_so(capsys, tmp_path):
    import json

    import tiny

    folder = tiny.save_model(tiny.random_model(0, scale=3.0), tmp_path / "target")
    args = ["run", "--model", str(folder), "--no-draft", "--raw", "hello"]
    assert main([*args, "--json", "--max-tokens", "2"]) == 0
    first = json.loads(capsys.readouterr().out)["tokens"][0]
    # the model's own config also ends a turn at that token: its answer ends at once
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "eos_token_id": [257, first]}))
    assert main(args) == 0
    out, err = capsys.readouterr()
    assert out.strip() == ""
    assert err.splitlines()[0].startswith("0 tokens")
    assert "the model ended its answer immediately (--raw sends the prompt" in err
