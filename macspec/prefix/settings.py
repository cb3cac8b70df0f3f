"""The disk tier's settings and a model's identity: light (no MLX), for the command line."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from macspec.models.home import macspec_home

BLOCK = 256
"""Ids per block: KV rows of 256 ids are a few MB on real models (a file opens and checks in
well under a millisecond besides reading its bytes), and a shared prefix is found to within
256 ids (README: the figures)."""
STATE_EVERY = 8
"""Recurrent state is kept at every this many boundaries, besides the boundaries where a
next request is likely to resume (binding.py): checkpoints, evicted in their turn."""
THIN_SHARE = 0.5
"""The states between checkpoints (`dense_states`) are evicted first, oldest first, while the
folder is over its bound and they fill more than this share of it: the most recent prompts
keep a state at every boundary, older ones thin out to the checkpoints."""
DEFAULT_GB = 10.0


@dataclass(frozen=True)
class DiskCacheSettings:
    """Where the disk tier lives and how large it may grow (--disk-cache-dir, --disk-cache-gb)."""

    gb: float = DEFAULT_GB
    """Most gigabytes (10^9 bytes) of block files; 0 turns the disk tier off (nothing written)."""
    folder: Path | None = None
    """None: `prompt-cache` in the macspec home."""
    block: int = BLOCK
    state_every: int = STATE_EVERY
    dense_states: bool = True
    """Recurrent state at every boundary: the ones between checkpoints as `state-thin` files,
    evicted first (`THIN_SHARE`), so a shared prefix is reused to within one block."""

    @property
    def enabled(self) -> bool:
        return self.gb > 0

    @property
    def root(self) -> Path:
        return self.folder if self.folder is not None else macspec_home() / "prompt-cache"

    @property
    def max_bytes(self) -> int:
        return int(self.gb * 1e9)


DEFAULT_DISK = DiskCacheSettings()
"""On, 10 GB, in the macspec home: what run, chat and serve use unless told otherwise."""


@dataclass(frozen=True)
class Identity:
    """Which model a cache belongs to: its fingerprint, and names for people."""

    fingerprint: str
    name: str
    folder: str | None = None

    @classmethod
    def of_folder(cls, folder: Path, name: str) -> Identity:
        from macspec.prefix.keys import folder_fingerprint

        return cls(folder_fingerprint(folder), name, str(folder))


def folder_identities(
    target: Path, target_name: str, draft: Path | None = None, draft_name: str | None = None
) -> dict[str, Identity]:
    """Identities of a loaded pair's model caches, by CachedModel name."""
    found = {"target model": Identity.of_folder(target, target_name)}
    if draft is not None:
        found["draft model"] = Identity.of_folder(draft, draft_name or str(draft))
    return found
