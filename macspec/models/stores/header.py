"""A GGUF file's metadata without its tensors, fast enough to list a store of large models
(gguf's GGUFReader indexes every array element and every tensor, seconds per file on a slow
CPU): the one GGUF header reader (`gguf.header`), in its listing mode.

Arrays are skipped, except the tokenizer's vocabulary and merges, whose raw bytes are hashed:
that hash is the tokenizer fingerprint two models are paired by.
"""

from __future__ import annotations

from pathlib import Path

from macspec.models.gguf.header import TOKENIZER_ARRAYS, GGUFHeader
from macspec.models.gguf.header import read_header as read_gguf_header

__all__ = ["TOKENIZER_ARRAYS", "GGUFHeader", "read_header"]


def read_header(path: Path) -> GGUFHeader:
    """The scalar and string metadata of the GGUF file at `path`, its arrays' lengths and its
    tokenizer's fingerprint; a file that is not GGUF, or whose header is cut or damaged, is
    one line (MacspecError)."""
    return read_gguf_header(path, strings=False, listing=True)
