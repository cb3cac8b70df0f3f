"""Architecture facts of the catalog's models (`known_configs.toml`), for memory estimates of
pairs that are not downloaded yet; a downloaded model's own config.json always wins."""

from __future__ import annotations

import functools
from pathlib import Path

from macspec.models.home import tomllib

KNOWN_CONFIGS = Path(__file__).with_name("known_configs.toml")


@functools.cache
def _known() -> dict[str, dict]:
    try:
        with KNOWN_CONFIGS.open("rb") as file:
            return dict(tomllib.load(file).get("configs", {}))
    except (OSError, tomllib.TOMLDecodeError):  # an estimate is a nicety: never fail on it
        return {}


def known_config(repo: str) -> dict | None:
    """The config.json fields that size `repo`'s KV cache, as published; None if unknown."""
    config = _known().get(repo)
    return dict(config) if config is not None else None
