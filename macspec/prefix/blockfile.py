"""One cached block on disk: a safetensors file whose metadata carries its key, the cache
format and a sha256 of its tensor bytes, written aside and renamed into place.

`mx.load` raises on a truncated file or a bad header but loads flipped bytes silently, so a
block is read here, whole, and its checksum verified before any array is made from it. A file
is written to a temporary name, flushed to the disk (fsync) and only then renamed to its
key's name: a process killed mid-write leaves a temporary file that nothing reads (the store
deletes it later), never a block that loads.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from pathlib import Path

import mlx.core as mx
import numpy as np

from macspec.prefix.keys import FORMAT

TEMP_MARK = ".tmp-"
"""In the name of a file being written (`<name>.tmp-<pid>-<random>`)."""

DTYPES = {
    mx.float32: ("F32", np.float32),
    mx.float16: ("F16", np.float16),
    mx.bfloat16: ("BF16", np.uint16),  # numpy has no bfloat16: its bytes, viewed back after
    mx.uint32: ("U32", np.uint32),
    mx.int32: ("I32", np.int32),
    mx.uint16: ("U16", np.uint16),
    mx.int16: ("I16", np.int16),
    mx.uint8: ("U8", np.uint8),
    mx.int8: ("I8", np.int8),
    mx.uint64: ("U64", np.uint64),
    mx.int64: ("I64", np.int64),
    mx.bool_: ("BOOL", np.bool_),
}
BY_CODE = {code: (mx_type, np_type) for mx_type, (code, np_type) in DTYPES.items()}


class Damaged(Exception):
    """A block file that must not be used: truncated, corrupt, or of another format or key."""


def write(path: Path, arrays: dict[str, mx.array], metadata: dict[str, str]) -> int:
    """Write evaluated arrays to `path` atomically; returns the bytes written. Reads the arrays'
    memory only (no MLX work), so it may run on another thread than the one computing."""
    names = sorted(arrays)
    views = [memoryview(arrays[name]).cast("B") for name in names]
    digest = hashlib.sha256()
    header: dict[str, object] = {}
    offset = 0
    for name, view in zip(names, views):
        digest.update(view)
        array = arrays[name]
        code = DTYPES[array.dtype][0]
        header[name] = {
            "dtype": code,
            "shape": list(array.shape),
            "data_offsets": [offset, offset + view.nbytes],
        }
        offset += view.nbytes
    meta = {**metadata, "format": str(FORMAT), "sha256": digest.hexdigest()}
    header["__metadata__"] = meta
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # safetensors aligns the data to 8 bytes
    temp = path.with_name(f"{path.name}{TEMP_MARK}{os.getpid()}-{secrets.token_hex(4)}")
    try:
        with open(temp, "wb") as file:
            file.write(len(text).to_bytes(8, "little"))
            file.write(text)
            for view in views:
                file.write(view)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return 8 + len(text) + offset


class Checked:
    """A block file read whole and checked; `arrays()` makes its MLX arrays."""

    def __init__(self, header: dict, body: memoryview):
        self.header, self.body = header, body

    def arrays(self) -> dict[str, mx.array]:
        """The tensors as MLX arrays (copies of the bytes read)."""
        arrays = {}
        for name, tensor in self.header.items():
            mx_type, np_type = BY_CODE[tensor["dtype"]]
            lo, hi = tensor["data_offsets"]
            flat = np.frombuffer(self.body[lo:hi], dtype=np_type)
            array = mx.array(flat.reshape(tensor["shape"]))
            arrays[name] = array.view(mx_type) if mx_type == mx.bfloat16 else array
        return arrays


def check(path: Path, key: str, kind: str) -> Checked:
    """Read a block file whole and check it; Damaged if anything is off. Pure Python (no MLX),
    so several files can be checked on threads at once (hashing releases the GIL)."""
    data = path.read_bytes()
    if len(data) < 8:
        raise Damaged("truncated (no header)")
    size = int.from_bytes(data[:8], "little")
    if 8 + size > len(data):
        raise Damaged("truncated (the header runs past the end)")
    try:
        header = json.loads(data[8 : 8 + size])
    except ValueError:
        raise Damaged("its header is not valid JSON") from None
    meta = header.pop("__metadata__", None) or {}
    if meta.get("format") != str(FORMAT):
        raise Damaged(f"another cache format ({meta.get('format')!r}; this macspec reads {FORMAT})")
    if meta.get("key") != key or meta.get("kind") != kind:
        raise Damaged("it belongs to another block")
    body = memoryview(data)[8 + size :]
    end = max((t["data_offsets"][1] for t in header.values()), default=0)
    if len(body) != end:
        raise Damaged(f"truncated ({len(body)} of {end} data bytes)")
    if any(t["dtype"] not in BY_CODE for t in header.values()):
        raise Damaged("a tensor of a type this macspec does not write")
    if hashlib.sha256(body).hexdigest() != meta.get("sha256"):
        raise Damaged("its checksum does not match (damaged on disk)")
    return Checked(header, body)


def read(path: Path, key: str, kind: str) -> dict[str, mx.array]:
    """The arrays of a block file, after checking it whole; Damaged if anything is off."""
    return check(path, key, kind).arrays()
