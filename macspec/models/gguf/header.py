"""A GGUF file's header: its metadata and tensor table, read and checked without the weights.

The layout (llama.cpp's gguf.md): magic `GGUF`, version, tensor and key counts, the key-value
metadata, then one entry per tensor (name, dims fastest first, type, offset), then the data
from the next `general.alignment` boundary. `gguf.GGUFReader` reads the same, but builds an
array per field (seconds for a 50k-token vocabulary); this reads it in one pass. Listing a
store of many-GB models reads the metadata alone (`listing`): arrays skipped, the tokenizer's
vocabulary and merges hashed as their raw bytes (the fingerprint models are paired by).
"""

from __future__ import annotations

import hashlib
import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType
from gguf.constants import GGML_QUANT_SIZES

from macspec.errors import MacspecError

MAGIC = b"GGUF"
VERSIONS = (2, 3)
"""Versions read here; version 1 counted in 32 bits and no file in use still has it."""
DEFAULT_ALIGNMENT = 32
MIB = 1 << 20

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?"}
_SCALARS.update({10: "<Q", 11: "<q", 12: "<d"})
_ARRAYS = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?"}
_ARRAYS.update({10: "<u8", 11: "<i8", 12: "<f8"})
_STRING, _ARRAY = 8, 9
TOKENIZER_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges")
"""The arrays whose bytes make the tokenizer fingerprint."""
MAX_KEYS = 1 << 16
"""More keys than this is a damaged header, not a model."""
MAX_TENSORS = 1 << 20
"""More tensors than this is a damaged header (the largest models list a few thousand), not a
cut download: said so, not "truncated"."""


@dataclass(frozen=True)
class TensorEntry:
    """One tensor's place in the file."""

    name: str
    shape: tuple[int, ...]
    """Row-major (numpy's order): the last axis is the one a quantization block runs along."""
    qtype: GGMLQuantizationType
    start: int
    """Byte offset in its file."""
    nbytes: int
    file: Path
    """The file that holds it: one of a split model's parts (`split`)."""


@dataclass(frozen=True)
class GGUFHeader:
    path: Path
    version: int
    metadata: dict[str, Any]
    """Scalars and strings as Python values, numeric arrays as numpy, string arrays as lists
    (as their lengths when read without strings; arrays left out when read for a listing)."""
    tensors: dict[str, TensorEntry]
    """Empty when read for a listing."""
    data_start: int
    """0 when read for a listing (the tensor table is not read)."""
    size: int
    """The file's size in bytes (a split model's: every part's)."""
    parts: tuple[GGUFHeader, ...] = ()
    """A split model's files, each its own header, in order (`split`); () for one file."""
    array_lengths: dict[str, int] = field(default_factory=dict)
    """Every array key and its element count (`tokenizer.ggml.tokens`: the vocabulary size)."""
    tokenizer_digest: str | None = None
    """sha256 of the vocabulary's and merges' raw bytes; None without a vocabulary."""

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", "?"))

    def arch_value(self, key: str) -> Any:
        """`{architecture}.{key}` (`context_length`, `block_count`, ...), or None."""
        return self.metadata.get(f"{self.architecture}.{key}")

    def identity(self) -> str:
        """A hash that changes with any re-download, re-quantization or fine-tune, cheap for
        many-GB files: the whole header (every key, every tensor's type, shape and offset), the
        size, and the first and last MiB of the tensor data; a split model's, every part's."""
        if self.parts:
            parts = "\0".join(part.identity() for part in self.parts)
            return hashlib.sha256(f"macspec gguf split\0{parts}".encode()).hexdigest()
        digest = hashlib.sha256(b"macspec gguf\0")
        with open(self.path, "rb") as file:
            digest.update(file.read(self.data_start + MIB))
            file.seek(max(0, self.size - MIB))
            digest.update(file.read(MIB))
        digest.update(str(self.size).encode())
        return digest.hexdigest()


class _Cursor:
    """Reads little-endian values from the mapped file, failing as 'truncated' past its end."""

    def __init__(self, data: mmap.mmap | bytes, strings: bool = True):
        self.data, self.pos, self.strings = data, 0, strings

    def take(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        length = self.take("<Q")
        if self.pos + length > len(self.data):
            raise struct.error("string past the end")
        raw = self.data[self.pos : self.pos + length]
        self.pos += length
        return bytes(raw).decode("utf-8", errors="replace")

    def value(self, kind: int) -> Any:
        if kind in _SCALARS:
            return self.take(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind != _ARRAY:
            raise ValueError(f"unknown metadata value type {kind}")
        item, count = self.take("<I"), self.take("<Q")
        if item == _STRING and not self.strings:  # skipped: a vocabulary is 100k strings
            self.skip(item, count)
            return count
        if item == _STRING:
            return [self.string() for _ in range(count)]
        if item == _ARRAY:  # each element an array of its own: its type, count and values
            return [self.value(_ARRAY) for _ in range(count)]
        if item not in _ARRAYS:
            raise ValueError(f"unknown metadata array type {item}")
        dtype = np.dtype(_ARRAYS[item])
        end = self.pos + count * dtype.itemsize
        if end > len(self.data):
            raise struct.error("array past the end")
        array = np.frombuffer(self.data, dtype, count, self.pos).copy()
        self.pos = end
        return array

    def skip(self, item: int, count: int) -> None:
        """Past an array's `count` values of type `item`, none decoded."""
        if item in _SCALARS:
            self.pos += struct.calcsize(_SCALARS[item]) * count
        elif item == _STRING:  # one tight loop: a vocabulary's 262k strings in tens of ms
            data, pos = self.data, self.pos
            for _ in range(count):
                pos += 8 + struct.unpack_from("<Q", data, pos)[0]
            self.pos = pos
        elif item == _ARRAY:
            for _ in range(count):
                self.skip(self.take("<I"), self.take("<Q"))
        else:
            raise ValueError(f"unknown metadata array type {item}")
        if self.pos > len(self.data):
            raise struct.error("array past the end")


def read_header(path: Path, strings: bool = True, listing: bool = False) -> GGUFHeader:
    """The header of a GGUF file, or one line saying why it is none, is cut short, or is a
    version this cannot read. `strings` False leaves each string array as its length (what
    loading the weights needs, without the vocabulary). `listing`: the metadata without its
    arrays (their lengths and the tokenizer's digest only) and no tensor table, what a store's
    listing needs of each of many large files."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as file:
            head = file.read(8)
            if head[:4] != MAGIC:
                raise MacspecError(f"{path}: not a GGUF file (it starts with {head[:4]!r})")
            version = int.from_bytes(head[4:8], "little")
            if version not in VERSIONS:
                raise MacspecError(
                    f"{path}: GGUF version {version}; macspec reads versions 2 and 3"
                )
            with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
                return _parse(path, data, version, size, strings, listing)
    except OSError as exc:
        raise MacspecError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except struct.error:  # a value, string or array runs past the file's end
        raise MacspecError(
            f"{path}: truncated GGUF header (the file ends at byte {size}; an incomplete download?)"
        ) from None
    except (ValueError, UnicodeDecodeError, OverflowError) as exc:
        raise MacspecError(f"{path}: damaged GGUF header ({exc})") from None


def _parse(
    path: Path, data: mmap.mmap, version: int, size: int, strings: bool, listing: bool
) -> GGUFHeader:
    cursor = _Cursor(data, strings)
    cursor.pos = 8
    tensor_count, key_count = cursor.take("<Q"), cursor.take("<Q")
    if key_count > MAX_KEYS:
        raise ValueError(f"{key_count} metadata keys")
    if tensor_count > MAX_TENSORS:
        raise ValueError(f"{tensor_count} tensors")
    metadata: dict[str, Any] = {}
    lengths: dict[str, int] = {}
    tokenizer = hashlib.sha256()
    for _ in range(key_count):
        key = cursor.string()
        kind = cursor.take("<I")
        if kind != _ARRAY:
            metadata[key] = cursor.value(kind)
            continue
        item, count = struct.unpack_from("<IQ", data, cursor.pos)
        start = cursor.pos + 12  # the values, after their type and count
        if listing:
            cursor.pos = start
            cursor.skip(item, count)
        else:
            metadata[key] = cursor.value(kind)
        lengths[key] = count
        if key in TOKENIZER_ARRAYS:
            tokenizer.update(key.encode() + count.to_bytes(8, "little"))
            tokenizer.update(data[start : cursor.pos])
    digest = tokenizer.hexdigest() if "tokenizer.ggml.tokens" in lengths else None
    if listing:
        return GGUFHeader(path, version, metadata, {}, 0, size, (), lengths, digest)
    table = []
    for _ in range(tensor_count):
        name = cursor.string()
        dims = [cursor.take("<Q") for _ in range(cursor.take("<I"))]
        table.append((name, tuple(reversed(dims)), cursor.take("<I"), cursor.take("<Q")))
    alignment = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT))
    data_start = -(-cursor.pos // alignment) * alignment
    tensors = {}
    for name, shape, type_id, offset in table:
        try:
            qtype = GGMLQuantizationType(type_id)
        except ValueError:
            raise MacspecError(f"{path}: tensor {name} has unknown type id {type_id}") from None
        block, type_size = GGML_QUANT_SIZES[qtype]
        count = int(np.prod(shape, dtype=np.int64))
        nbytes = count // block * type_size
        entry = TensorEntry(name, shape, qtype, data_start + offset, nbytes, path)
        if entry.start + entry.nbytes > size:
            raise MacspecError(
                f"{path}: truncated ({size} bytes; tensor {name} ends at byte "
                f"{entry.start + entry.nbytes}); an incomplete download?"
            )
        tensors[name] = entry
    return GGUFHeader(path, version, metadata, tensors, data_start, size, (), lengths, digest)
