"""Words in output shared by every command."""

from __future__ import annotations


def counted(count: int, noun: str) -> str:
    """'1 step', '2 steps', '1,024 tokens': a count and its noun, singular for one."""
    return f"{count:,} {noun}" if count == 1 else f"{count:,} {noun}s"
