"""A GGUF file's metadata without its tensors: a minimal reader of the header's key/value
section, fast enough to list a store of large models (gguf's GGUFReader indexes every array
element and every tensor, seconds per file on a slow CPU).

Arrays are skipped, except the tokenizer's vocabulary and merges, whose raw bytes are hashed:
that hash is the tokenizer fingerprint two models are paired by.
"""

from __future__ import annotations

import hashlib
import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from macspec.errors import MacspecError

_SCALARS = {
    0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q",
    12: "<d",
}  # fmt: skip
_STRING, _ARRAY = 8, 9
TOKENIZER_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges")
"""The arrays whose bytes make the tokenizer fingerprint."""
MAX_KEYS = 1 << 16
"""More keys than this is a damaged header, not a model."""


@dataclass
class GGUFHeader:
    """The scalar and string metadata of one GGUF file, and its tokenizer's fingerprint."""

    metadata: dict[str, Any] = field(default_factory=dict)
    """Keys with a scalar or string value (arrays are left out)."""
    array_lengths: dict[str, int] = field(default_factory=dict)
    """Every array key and its element count (`tokenizer.ggml.tokens`: the vocabulary size)."""
    tokenizer_digest: str | None = None
    """sha256 of the vocabulary's and merges' raw bytes; None without a vocabulary."""

    @property
    def architecture(self) -> str | None:
        value = self.metadata.get("general.architecture")
        return value if isinstance(value, str) else None

    def arch_value(self, key: str) -> Any:
        """`{architecture}.{key}` (`context_length`, `block_count`, ...), or None."""
        return self.metadata.get(f"{self.architecture}.{key}")


class _Cursor:
    def __init__(self, data: mmap.mmap | bytes):
        self.data, self.offset = data, 0

    def take(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if self.offset + size > len(self.data):
            raise ValueError("the header runs past the end of the file")
        (value,) = struct.unpack_from(fmt, self.data, self.offset)
        self.offset += size
        return value

    def string(self) -> str:
        length = self.take("<Q")
        if self.offset + length > len(self.data):
            raise ValueError("a string runs past the end of the file")
        raw = self.data[self.offset : self.offset + length]
        self.offset += length
        return bytes(raw).decode("utf-8", errors="replace")

    def skip_array(self, kind: int, count: int) -> None:
        if kind in _SCALARS:
            self.offset += struct.calcsize(_SCALARS[kind]) * count
        elif kind == _STRING:
            data, offset = self.data, self.offset
            for _ in range(count):
                (length,) = struct.unpack_from("<Q", data, offset)
                offset += 8 + length
            self.offset = offset
        elif kind == _ARRAY:
            for _ in range(count):
                self.skip_array(self.take("<I"), self.take("<Q"))
        else:
            raise ValueError(f"unknown value type {kind}")
        if self.offset > len(self.data):
            raise ValueError("an array runs past the end of the file")


def read_header(path: Path) -> GGUFHeader:
    """The metadata of the GGUF file at `path`; a file that is not GGUF, or whose header is cut
    or damaged, is one line (MacspecError)."""
    try:
        with path.open("rb") as file:
            if file.read(4) != b"GGUF":
                raise MacspecError(f"{path}: not a GGUF file")
            with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
                return _parse(_Cursor(data))
    except (ValueError, struct.error, OverflowError) as exc:
        raise MacspecError(f"{path}: a damaged GGUF header ({exc})") from None
    except OSError as exc:
        raise MacspecError(f"{path}: cannot read it ({exc.strerror or exc})") from None


def _parse(cursor: _Cursor) -> GGUFHeader:
    cursor.offset = 4
    version = cursor.take("<I")
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version}; versions 2 and 3 are read")
    cursor.take("<Q")  # tensors: not needed here
    keys = cursor.take("<Q")
    if keys > MAX_KEYS:
        raise ValueError(f"{keys} metadata keys")
    header = GGUFHeader()
    tokenizer = hashlib.sha256()
    for _ in range(keys):
        key = cursor.string()
        kind = cursor.take("<I")
        if kind in _SCALARS:
            header.metadata[key] = cursor.take(_SCALARS[kind])
        elif kind == _STRING:
            header.metadata[key] = cursor.string()
        elif kind == _ARRAY:
            element, count = cursor.take("<I"), cursor.take("<Q")
            start = cursor.offset
            cursor.skip_array(element, count)
            header.array_lengths[key] = count
            if key in TOKENIZER_ARRAYS:
                tokenizer.update(key.encode() + count.to_bytes(8, "little"))
                tokenizer.update(cursor.data[start : cursor.offset])
        else:
            raise ValueError(f"unknown value type {kind} for {key}")
    if "tokenizer.ggml.tokens" in header.array_lengths:
        header.tokenizer_digest = tokenizer.hexdigest()
    return header
