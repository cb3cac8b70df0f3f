"""Helpers for the hub and CLI tests: a tiny user catalog, a CLI call, a file-tree fingerprint."""

from __future__ import annotations

from pathlib import Path

from macspec.cli import main
from macspec.models import home

PAIR = """
[[pair]]
name = "tiny"
target = "test/tiny-target"
draft = "test/tiny-draft"
draft_policy = "auto"
context_length = 4096
description = "a test pair"
size_gb = 0.01

[[pair]]
name = "tiny2"
target = "test/tiny-target2"
draft = "test/tiny-draft"
draft_policy = 3
context_length = 4096
description = "another pair sharing the draft"
size_gb = 0.01
"""


def write_tiny_pair() -> Path:
    """Write the two test pairs into the user catalog (the hf_cache fixture moved the home)."""
    path = home.user_catalog_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(PAIR)
    return path


def cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def tree(root: Path) -> list[str]:
    """Every path under `root` with its size: a fingerprint to show nothing was written."""
    if not root.exists():
        return []
    return sorted(f"{p.relative_to(root)}:{p.lstat().st_size}" for p in root.rglob("*"))


def files_bytes(snapshot: Path) -> int:
    return sum(p.resolve().stat().st_size for p in snapshot.iterdir())
