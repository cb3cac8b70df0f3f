"""Log lines worth saying once per server, not with every request (agents resend the same
tools each turn)."""

from __future__ import annotations

import logging

log = logging.getLogger("macspec.serve")
_said: set[str] = set()


def log_once(message: str) -> None:
    """Log `message` the first time it comes up."""
    if message not in _said:
        _said.add(message)
        log.info(message)
