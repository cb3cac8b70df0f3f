"""What a cached block is called: a hash chain over token ids, under the model's identity.

A block's key is sha256(parent key, the block's ids); the first block's parent is the root,
sha256 of the model's fingerprint and every setting that changes what the cache holds (the
cache format, the block size, KV quantization, the sliding window). So a key names one exact
prefix of ids on one exact model with one exact cache layout: a block of another model, another
format or other settings is never found, because its key differs. Blocks are keyed by ids,
never by text: two tokenizers can turn the same text into different ids.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

FORMAT = 1
"""macspec's prompt-cache format: in every key (through the root) and every file's metadata."""

MIB = 1 << 20


def folder_fingerprint(folder: Path) -> str:
    """A model folder's identity, cheap for many-GB weights: config.json, and each safetensors
    file's name, size, header (every tensor's name, dtype, shape and offsets) and first and last
    MiB. Any re-download, re-quantization or fine-tune changes it."""
    digest = hashlib.sha256(b"macspec model\0")
    digest.update((folder / "config.json").read_bytes())
    for weights in sorted(folder.glob("*.safetensors")):
        size = weights.stat().st_size
        digest.update(f"\0{weights.name}\0{size}\0".encode())
        with weights.open("rb") as file:
            head = file.read(8)
            header = int.from_bytes(head, "little") if len(head) == 8 else 0
            digest.update(head + file.read(min(header, size)))
            digest.update(file.read(MIB))
            file.seek(max(0, size - MIB))
            digest.update(file.read(MIB))
    return digest.hexdigest()


def settings_text(block: int, options) -> str:
    """The settings that change a cache's arrays, as one canonical string (CacheOptions)."""
    settings = {"format": FORMAT, "block": block, "max_kv_size": options.max_kv_size}
    if options.kv_bits is not None:  # group size and start only matter when quantizing
        settings.update(
            kv_bits=options.kv_bits,
            kv_group_size=options.kv_group_size,
            quantized_kv_start=options.quantized_kv_start,
        )
    return json.dumps(settings, sort_keys=True)


def root_key(fingerprint: str, settings: str) -> str:
    return hashlib.sha256(f"macspec prompt cache\0{fingerprint}\0{settings}".encode()).hexdigest()


def block_key(parent: str, ids: Sequence[int]) -> str:
    digest = hashlib.sha256(bytes.fromhex(parent))
    digest.update(np.asarray(ids, dtype="<u4").tobytes())
    return digest.hexdigest()


class Chain:
    """The keys of the blocks of id sequences, remembering the last sequence's keys, since the
    next one (a longer prompt, the same prompt's boundaries one by one) mostly shares them."""

    def __init__(self, root: str, block: int):
        self.root = root
        self.block = block
        self._ids: list[int] = []
        self._keys: list[str] = []

    def keys(self, ids: Sequence[int], count: int) -> list[str]:
        """Keys of the first `count` whole blocks of `ids`."""
        block = self.block
        reuse = 0
        while reuse < min(count, len(self._keys)) and self._ids[
            reuse * block : (reuse + 1) * block
        ] == list(ids[reuse * block : (reuse + 1) * block]):
            reuse += 1
        keys = self._keys[:reuse]
        for index in range(reuse, count):
            parent = keys[-1] if keys else self.root
            keys.append(block_key(parent, ids[index * block : (index + 1) * block]))
        if count >= len(self._keys) or reuse < count:
            self._ids, self._keys = list(ids[: count * block]), keys
        return keys

    def parent(self, keys: list[str], index: int) -> str:
        return keys[index - 1] if index else self.root
