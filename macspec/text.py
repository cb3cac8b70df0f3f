"""Words in output shared by every command."""

from __future__ import annotations


def counted(count: int, noun: str) -> str:
    """'1 step', '2 steps', '1,024 tokens': a count and its noun, singular for one."""
    return f"{count:,} {noun}" if count == 1 else f"{count:,} {noun}s"


def byte_size(nbytes: int) -> str:
    """'1.12 GB' from 100 MB up, '3.4 MB' below."""
    return f"{nbytes / 1e9:.2f} GB" if nbytes >= 1e8 else f"{nbytes / 1e6:.1f} MB"
