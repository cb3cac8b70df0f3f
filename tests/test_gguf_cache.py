"""`macspec cache` lists the GGUF files derived for MLX (the file each came from, the converted
weights' and the folder's size, when last used, a file since deleted said so) and `cache clear`
removes them: all, only them (--gguf), or one by name. Tiny files written with gguf's writer."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as Q
from ggufkit import tiny_gguf

from macspec.cli import main
from macspec.models import hub
from macspec.models.gguf.layout import Layout
from macspec.models.gguf.load import CONVERTED, load_gguf_model
from macspec.models.home import macspec_home


def cached(capsys) -> dict[str, dict]:
    assert main(["cache", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["gguf"]["folder"] == str(macspec_home() / "gguf")
    return {entry["name"]: entry for entry in record["gguf"]["files"]}


@pytest.fixture
def loaded(tmp_path, monkeypatch) -> dict[str, Path]:
    """A Q5_0 file (converted) and a Q4_0 one (read as mx.load reads it), each loaded once."""
    monkeypatch.setenv("MACSPEC_HOME", str(tmp_path / "home"))
    paths = {}
    for kind in (Q.Q5_0, Q.Q4_0):
        (tmp_path / kind.name).mkdir()
        path = tiny_gguf(tmp_path / kind.name, kind)
        load_gguf_model(hub.local_model_path(str(path)))
        paths[kind.name] = path
    return paths


def test_cache_lists_each_derived_file(loaded, capsys):
    files = cached(capsys)
    assert sorted(files) == sorted(path.name for path in loaded.values())
    converted = files[loaded["Q5_0"].name]
    folder = Path(converted["folder"])
    assert converted["file"] == str(loaded["Q5_0"]) and converted["file_exists"] is True
    assert converted["converted_bytes"] == (folder / CONVERTED[Layout.COMPACT]).stat().st_size > 0
    on_disk = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    assert converted["bytes"] == on_disk > converted["converted_bytes"]
    assert time.time() - converted["last_used"] < 600
    native = files[loaded["Q4_0"].name]
    assert native["converted_bytes"] == 0 < native["bytes"]  # config and tokenizer only

    assert main(["cache"]) == 0
    table = capsys.readouterr().out
    assert "converted GGUF files" in table and "file gone" not in table
    assert loaded["Q5_0"].name in table and loaded["Q4_0"].name in table


def test_a_load_marks_its_folder_used(loaded, capsys):
    folder = Path(cached(capsys)[loaded["Q5_0"].name]["folder"])
    os.utime(folder, (1_000_000, 1_000_000))
    assert cached(capsys)[loaded["Q5_0"].name]["last_used"] == 1_000_000
    load_gguf_model(folder)
    assert time.time() - cached(capsys)[loaded["Q5_0"].name]["last_used"] < 600


def test_a_deleted_file_is_shown_gone_and_cleared(loaded, capsys):
    loaded["Q4_0"].unlink()
    files = cached(capsys)
    assert files[loaded["Q4_0"].name]["file_exists"] is False
    assert files[loaded["Q5_0"].name]["file_exists"] is True
    assert main(["cache"]) == 0
    gone = [line for line in capsys.readouterr().out.splitlines() if "file gone" in line]
    assert len(gone) == 1 and loaded["Q4_0"].name in gone[0]
    assert main(["cache", "clear"]) == 0
    assert "freed" in capsys.readouterr().out
    assert cached(capsys) == {}
    assert list((macspec_home() / "gguf").iterdir()) == []


def test_clear_one_by_name_or_only_the_gguf_files(loaded, capsys):
    prompts = macspec_home() / "prompt-cache" / "a-model" / "kept.bin"
    prompts.parent.mkdir(parents=True)
    prompts.write_bytes(b"x")
    assert main(["cache", "clear", "--gguf", "--model", "nothing-like-it"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no model named 'nothing-like-it'" in err
    assert loaded["Q4_0"].name in err  # what is cached, named

    assert main(["cache", "clear", "--model", loaded["Q5_0"].name]) == 0
    assert "freed" in capsys.readouterr().out
    assert list(cached(capsys)) == [loaded["Q4_0"].name]
    assert main(["cache", "clear", "--gguf"]) == 0
    capsys.readouterr()
    assert cached(capsys) == {} and prompts.is_file()  # the prompt cache untouched

    # Cleared, the file is derived and converted again by its next load.
    folder = hub.local_model_path(str(loaded["Q5_0"]))
    load_gguf_model(folder)
    assert (folder / CONVERTED[Layout.COMPACT]).is_file()


def test_a_killed_conversions_leftover_is_not_read_and_is_freed(loaded, capsys):
    """A first load killed mid-write (SIGKILL: no `finally`) leaves its temporary copy, a cut
    safetensors file. The next `run` neither reads it nor calls the folder damaged, and its
    conversion deletes it; a live process's copy in progress is kept."""
    folder = Path(cached(capsys)[loaded["Q5_0"].name]["folder"])
    (folder / CONVERTED[Layout.COMPACT]).unlink()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    left = folder / f"compact.{dead.pid}.partial.safetensors"
    left.write_bytes((100).to_bytes(8, "little") + b'{"a": {"dtype')  # cut in its header
    writing = folder / f"compact.{os.getppid()}.partial.safetensors"  # a live process's
    writing.write_bytes(b"\0" * 10)
    args = ["run", "--model", str(loaded["Q5_0"]), "--no-draft", "--max-tokens", "2", "--raw"]
    assert main([*args, "a"]) == 0, capsys.readouterr().err
    assert not left.exists() and writing.is_file()
    assert (folder / CONVERTED[Layout.COMPACT]).is_file()


def test_a_folder_left_half_made_by_a_killed_process_is_freed(loaded, capsys):
    """Killed while deriving a file's folder (tokenizer, config), a process leaves its hidden
    temporary sibling, never renamed and never listed: the next derivation deletes it; one a
    live process is filling is kept."""
    folder = Path(cached(capsys)[loaded["Q5_0"].name]["folder"])
    shutil.rmtree(folder)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    left = folder.parent / f".{folder.name}.{dead.pid}.k1ll3d"
    filling = folder.parent / f".{folder.name}.{os.getppid()}.f1ll1n"
    for partial in (left, filling):
        partial.mkdir()
        (partial / "tokenizer.json").write_text("{")
    assert hub.local_model_path(str(loaded["Q5_0"])) == folder
    assert (folder / "config.json").is_file()
    assert not left.exists() and filling.is_dir()


def test_a_full_disk_while_keeping_the_copy_is_one_line(loaded, capsys, monkeypatch):
    import mlx.core as mx

    folder = Path(cached(capsys)[loaded["Q5_0"].name]["folder"])
    (folder / CONVERTED[Layout.COMPACT]).unlink()

    def full(file: str, arrays: dict) -> None:
        Path(file).write_bytes(b"\0" * 8)
        raise RuntimeError("[write] Unable to write 8 bytes to file.")  # MLX's words on ENOSPC

    monkeypatch.setattr(mx, "save_safetensors", full)
    args = ["run", "--model", str(loaded["Q5_0"]), "--no-draft", "--max-tokens", "2", "--raw"]
    assert main([*args, "a"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(folder) in err and "Unable to write" in err
    assert [p.name for p in folder.glob("*.safetensors")] == []  # nothing cut left behind


def test_a_damaged_converted_copy_names_the_command_that_converts_it_again(loaded, capsys):
    folder = Path(cached(capsys)[loaded["Q5_0"].name]["folder"])
    copy = folder / CONVERTED[Layout.COMPACT]
    os.truncate(copy, copy.stat().st_size // 2)  # a disk error, say: not a kill (renamed whole)
    args = ["run", "--model", str(loaded["Q5_0"]), "--no-draft", "--max-tokens", "2", "--raw"]
    assert main([*args, "a"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "compact.safetensors is truncated" in err
    assert f"macspec cache clear --model {loaded['Q5_0'].name}" in err and "download" not in err
    assert main(["cache", "clear", "--model", loaded["Q5_0"].name]) == 0
    assert main([*args, "a"]) == 0
