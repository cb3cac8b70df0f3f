"""One set of defaults (macspec/cli/options.py): run, chat and serve answer with the same
sampling and the same --max-tokens unless told otherwise; the commands that differ say why in
their help."""

from __future__ import annotations

import json

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


def test_output_names_the_shipped_models_as_users_see_them(capsys):
    """run --json (and serve's start-up line, bench's record, `macspec cache`) show the demo's
    models without the internal `package:` prefix: `demo/target`, as chat says `demo`."""
    from macspec.cli import main

    assert main(["run", "--json", "--max-tokens", "4", "hi"]) == 0
    out = capsys.readouterr().out
    record = json.loads(out)
    assert (record["model"], record["draft_model"]) == ("demo/target", "demo/draft-tuned")
    assert "package:" not in out


def test_cache_lists_a_shipped_model_by_its_shown_name(tmp_path):
    from macspec.prefix.store import MODEL_FILE, DiskStore

    folder = tmp_path / "0123abcd"
    folder.mkdir()
    (folder / MODEL_FILE).write_text(json.dumps({"name": "package:demo/target"}))
    usage = DiskStore(tmp_path, max_bytes=0).usage()
    assert [m.name for m in usage if m.folder == folder] == ["demo/target"]


def test_bench_k_takes_auto_as_the_other_commands_do():
    from macspec.cli.bench import parse_ks

    assert parse_ks("2,auto,4", (3,)) == (2, 4)
    assert parse_ks("auto", (2, 3, 4)) == (2, 3, 4)  # the adaptive length always runs beside
    group = typer.main.get_command(app)
    k_help = next(p.help for p in group.commands["bench"].params if p.name == "k")
    assert "'auto'" in k_help and "always runs beside" in k_help


def test_piped_cache_listing_names_every_model_whole(tmp_path, capsys):
    """Piped, `macspec cache` is not cut at 80 columns: two long paths that differ only at
    their ends are both whole, as `cache clear --model` takes them."""
    from macspec.cli import main
    from macspec.prefix.store import MODEL_FILE, SUFFIX

    names = [f"/Users/someone/models/{'very-long-folder-' * 4}/model-q4_k_m-{n}.gguf" for n in "ab"]
    for index, name in enumerate(names):
        block = tmp_path / f"model{index}" / "ab" / f"ab12.rows{SUFFIX}"  # one cached block
        block.parent.mkdir(parents=True)
        block.write_bytes(b"\0" * 8)
        (tmp_path / f"model{index}" / MODEL_FILE).write_text(json.dumps({"name": name}))
    assert main(["cache", "--disk-cache-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in names)
