"""Tokenizer fingerprints: whether two models share a tokenizer, without scanning it twice.

A fingerprint is a hash of the vocabulary (every token and its id) and the end-of-sequence ids.
It is computed once per tokenizer (one `get_vocab()`), then cached in the macspec home, keyed
by a hash of the model folder's tokenizer files: loading a pair again reads no vocabulary at
all, and a draft's tokenizer is not even loaded when its fingerprint is known.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from macspec.models.home import macspec_home

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "generation_config.json",
    "chat_template.jinja",
    "chat_template.json",
    "config.json",  # its eos_token_id decides the end of sequence too
)


FINGERPRINT_VERSION = b"eos ids as mlx_lm.load gives them (generation_config.json too)"
"""Mixed into the cache key: a fingerprint computed with other end-of-sequence ids is stale."""


@dataclass(frozen=True)
class Fingerprint:
    digest: str
    """A hash of the vocabulary and the end-of-sequence ids."""
    size: int
    """Tokens in the vocabulary."""


def files_key(folder: Path) -> str:
    """A hash of the tokenizer files' names and contents (what the cache is keyed by)."""
    h = hashlib.sha256(FINGERPRINT_VERSION)
    for name in TOKENIZER_FILES:
        path = folder / name
        if path.is_file():
            h.update(name.encode())
            with path.open("rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
    return h.hexdigest()


def compute(tokenizer) -> Fingerprint:
    """The fingerprint of a loaded tokenizer: one scan of its vocabulary."""
    vocab = tokenizer.get_vocab()
    h = hashlib.sha256()
    h.update(json.dumps(sorted(vocab.items()), ensure_ascii=False).encode())
    h.update(json.dumps(sorted(tokenizer.eos_token_ids)).encode())
    return Fingerprint(h.hexdigest(), len(vocab))


def fingerprint(folder: Path, load: Callable[[], object]) -> Fingerprint:
    """The folder's tokenizer fingerprint: from the cache, or computed with `load()`d and saved."""
    cache = macspec_home() / "tokenizers" / f"{files_key(folder)}.json"
    try:
        saved = json.loads(cache.read_text(encoding="utf-8"))
        return Fingerprint(saved["digest"], int(saved["size"]))
    except (OSError, ValueError, KeyError, TypeError):
        pass
    found = compute(load())
    try:  # a cache: when it cannot be written, the next load computes it again
        cache.parent.mkdir(parents=True, exist_ok=True)
        partial = cache.with_suffix(f".{os.getpid()}.partial")
        partial.write_text(json.dumps({"digest": found.digest, "size": found.size}))
        partial.replace(cache)
    except OSError:
        pass
    return found
