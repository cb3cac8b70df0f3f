"""`--gguf-layout` (and `MACSPEC_GGUF_LAYOUT`) as a user types it: a bad name is refused before
anything is derived or loaded, and `exact` keeps its own converted copy beside compact's."""

from __future__ import annotations

import pytest
from ggufkit import tiny_gguf

from macspec.cli import main
from macspec.models.gguf.layout import Layout
from macspec.models.gguf.load import CONVERTED


@pytest.fixture
def home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("MACSPEC_HOME", str(home))
    monkeypatch.delenv("MACSPEC_GGUF_LAYOUT", raising=False)
    return home


@pytest.mark.parametrize("command", ["run", "chat", "bench", "serve"])
def test_a_bad_layout_name_is_one_line_before_the_file_is_read(tmp_path, home, capsys, command):
    path = tiny_gguf(tmp_path)
    args = [command, "--model", str(path), "--gguf-layout", "tiny"]
    assert main([*args, "Hi"] if command == "run" else args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--gguf-layout" in err and "'tiny'" in err
    assert "compact" in err and "exact" in err
    assert not (home / "gguf").exists()  # nothing derived: the flag was checked first


def test_a_bad_layout_in_the_environment_is_refused_the_same_way(
    tmp_path, home, capsys, monkeypatch
):
    monkeypatch.setenv("MACSPEC_GGUF_LAYOUT", "Exact!")
    assert main(["run", "--model", str(tiny_gguf(tmp_path)), "Hi"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'Exact!'" in err
    assert not (home / "gguf").exists()


def test_exact_on_the_command_line_keeps_its_own_copy(tmp_path, home, capsys):
    path = tiny_gguf(tmp_path)
    args = ["run", "--model", str(path), "--no-draft", "--max-tokens", "2", "--raw", "a"]
    assert main([*args, "--gguf-layout", "exact"]) == 0
    [folder] = (home / "gguf").iterdir()
    assert (folder / CONVERTED[Layout.EXACT]).is_file()
    assert not (folder / CONVERTED[Layout.COMPACT]).exists()
    assert main(args) == 0  # the default is compact: a second copy, the first kept
    assert (folder / CONVERTED[Layout.COMPACT]).is_file()
    assert (folder / CONVERTED[Layout.EXACT]).is_file()
