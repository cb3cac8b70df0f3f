"""A cache cut into blocks of ids and put back together: what a prompt cache stores.

At a block boundary (after the first `length` ids, `length` a multiple of the block size) a
model's cache is described by two kinds of arrays:
- **rows**: each attention layer's keys and values for the ids of one block (`KVCache`,
  `QuantizedKVCache` as it is stored, and the rows of a sliding window, `RotatingKVCache`);
  a block's rows never change once computed, so each block is stored once;
- **state**: each recurrent layer's arrays (`ArraysCache`: Gated DeltaNet, Mamba, short
  convolutions), which sum up every id before the boundary and are stored whole.

`rebuild` turns the rows of blocks 0..j-1 and the state at boundary j back into a fresh cache
that holds what a prefill in block-sized chunks held at that boundary, array for array, so the
ids after it are computed exactly as they would have been. Nothing here touches a file: the
prompt cache (macspec/prefix) stores and loads these arrays.

Arrays are named `<layer>.<part>`: `3.k`, `3.v` (quantized: `3.k.0`, `3.k.1`, `3.k.2`),
`5.0`, `5.1` for an ArraysCache's arrays; a `CacheList` nests (`7.0.k`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import (
    ArraysCache,
    CacheList,
    ConcatenateKVCache,
    KVCache,
    QuantizedKVCache,
    RotatingKVCache,
)


@dataclass(frozen=True)
class Boundaries:
    """Where prefill chunks end, and who is told when one is reached (a prompt cache, which
    stores the cache there): a cold prefill and one that resumes at a boundary then run the
    same chunks, so they compute the same arrays."""

    block: int
    """Chunks end at every multiple of this many ids."""
    reached: Callable[[Any, int], None]
    """Called with the CachedModel after each chunk that ends at a multiple of `block`."""


ROW_CACHES = (KVCache, QuantizedKVCache, ConcatenateKVCache, RotatingKVCache)
"""Caches whose content is one row per id: stored block by block."""
STATE_CACHES = (ArraysCache,)
"""Caches that sum up every id seen: stored whole at a boundary."""


def leaves(cache: list[Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(name, layer cache) of every layer, a CacheList's members named under its own."""
    for i, layer_cache in enumerate(cache):
        name = f"{prefix}{i}"
        if isinstance(layer_cache, CacheList):
            yield from leaves(list(layer_cache.caches), f"{name}.")
        else:
            yield name, layer_cache


def unsupported(cache: list[Any]) -> str | None:
    """The name of a cache type that cannot be cut into blocks (None: every layer can)."""
    for _, layer_cache in leaves(cache):
        if not isinstance(layer_cache, ROW_CACHES + STATE_CACHES):
            return type(layer_cache).__name__
    return None


def has_rows(cache: list[Any]) -> bool:
    return any(isinstance(c, ROW_CACHES) for _, c in leaves(cache))


def has_state(cache: list[Any]) -> bool:
    return any(isinstance(c, STATE_CACHES) for _, c in leaves(cache))


# -- cutting -------------------------------------------------------------------------------------
def _window_positions(layer_cache: RotatingKVCache) -> tuple[mx.array, int]:
    """A sliding window's rows in time order, and the position of the row after its first
    `keep` rows (they always hold positions 0..keep-1)."""
    ordered = layer_cache._temporal_order(layer_cache.keys)
    held = ordered.shape[2]
    first = 0 if held >= layer_cache.offset else layer_cache.offset - (held - layer_cache.keep)
    return ordered, first


def _window_rows(layer_cache: RotatingKVCache, start: int, end: int) -> list[mx.array] | None:
    """Keys and values of positions [start, end) of a window, or None where it dropped some."""
    keys, first = _window_positions(layer_cache)
    values = layer_cache._temporal_order(layer_cache.values)
    if first == 0:
        lo = start
    elif start >= first:
        lo = layer_cache.keep + start - first
    else:
        return None
    hi = lo + end - start
    return [keys[..., lo:hi, :], values[..., lo:hi, :]]


def rows(cache: list[Any], start: int, end: int) -> dict[str, mx.array] | None:
    """Every attention layer's keys and values for positions [start, end), as new contiguous
    arrays (queued, not evaluated); None when a sliding window no longer holds them all."""
    out: dict[str, mx.array] = {}
    for name, layer_cache in leaves(cache):
        if isinstance(layer_cache, RotatingKVCache):
            parts = _window_rows(layer_cache, start, end)
            if parts is None:
                return None
            out[f"{name}.k"], out[f"{name}.v"] = parts
        elif isinstance(layer_cache, QuantizedKVCache):
            for side, arrays in (("k", layer_cache.keys), ("v", layer_cache.values)):
                for i, array in enumerate(arrays):
                    out[f"{name}.{side}.{i}"] = array[..., start:end, :]
        elif isinstance(layer_cache, ROW_CACHES):
            out[f"{name}.k"] = layer_cache.keys[..., start:end, :]
            out[f"{name}.v"] = layer_cache.values[..., start:end, :]
    return {key: mx.contiguous(value) for key, value in out.items()}


def state(cache: list[Any]) -> dict[str, mx.array]:
    """Every recurrent layer's arrays as they are now (new handles: later steps cannot reach
    them)."""
    out = {}
    for name, layer_cache in leaves(cache):
        if isinstance(layer_cache, STATE_CACHES):
            for i, array in enumerate(layer_cache.cache):
                if array is not None:
                    out[f"{name}.{i}"] = mx.contiguous(array)
    return out


# -- putting back --------------------------------------------------------------------------------
def window_spans(length: int, block: int, keep: int, max_size: int) -> list[tuple[int, int]]:
    """Positions a sliding window holds right after a prefill chunk of one block ends at
    `length`: mlx-lm's RotatingKVCache first cuts what it held to its last max_size - 1 rows
    (its first `keep` rows stay), then appends the chunk."""
    before = length - block
    if before <= max_size - 1:
        return [(0, length)]
    spans = [(0, keep)] if keep else []
    return [*spans, (before - (max_size - 1 - keep), length)]


def blocks_needed(template: list[Any], length: int, block: int, head: int = 0) -> set[int]:
    """Indices of the blocks whose rows `rebuild` reads to restore `length` ids, when the
    first `head` ids' full-attention rows come from elsewhere (a cache in memory)."""
    needed: set[int] = set()
    for _, layer_cache in leaves(template):
        if isinstance(layer_cache, RotatingKVCache):
            for lo, hi in window_spans(length, block, layer_cache.keep, layer_cache.max_size):
                needed.update(range(lo // block, -(-hi // block)))
        elif isinstance(layer_cache, ROW_CACHES):
            needed.update(range(head // block, length // block))
    return needed


def rebuild(
    template: list[Any],
    length: int,
    block: int,
    block_rows: Callable[[int], dict[str, mx.array]],
    state_arrays: dict[str, mx.array] | None,
    quantize: tuple[int, int] | None = None,
    head: list[Any] | None = None,
    head_length: int = 0,
) -> list[Any]:
    """A cache holding the first `length` ids (a multiple of `block`), from a fresh cache of
    the model (`template`, as `make_prompt_cache` builds it), the rows of blocks
    (`block_rows(i)`), and the recurrent state at `length`.

    `quantize`: (group size, bits) when full-attention rows are quantized at this length.
    `head`: a cache already holding the first `head_length` ids (a multiple of `block`), whose
    full-attention rows are used instead of those blocks'.
    """
    heads = dict(leaves(head)) if head is not None else {}

    def build(name: str, fresh: Any) -> Any:
        if isinstance(fresh, CacheList):
            members = [build(f"{name}.{i}", c) for i, c in enumerate(fresh.caches)]
            return CacheList(*members)
        if isinstance(fresh, RotatingKVCache):
            return _window(name, fresh, length, block, block_rows)
        if isinstance(fresh, STATE_CACHES):
            return _recurrent(name, fresh, state_arrays)
        layer = _full(name, length, block, block_rows, quantize, heads.get(name), head_length)
        if isinstance(fresh, ConcatenateKVCache) and isinstance(layer, KVCache):
            plain = ConcatenateKVCache()
            plain.keys, plain.values, plain.offset = layer.keys, layer.values, length
            return plain
        return layer

    return [build(str(i), c) for i, c in enumerate(template)]


def _gather(name: str, side: str, lo: int, hi: int, block: int, block_rows) -> list[mx.array]:
    """Pieces of one layer's rows for positions [lo, hi), from the blocks that hold them."""
    pieces = []
    for index in range(lo // block, -(-hi // block)):
        rows_of_block = block_rows(index)[f"{name}.{side}"]
        start = max(lo, index * block) - index * block
        end = min(hi, (index + 1) * block) - index * block
        pieces.append(rows_of_block[..., start:end, :])
    return pieces


def _window(name, fresh: RotatingKVCache, length, block, block_rows) -> RotatingKVCache:
    spans = window_spans(length, block, fresh.keep, fresh.max_size)
    sides = []
    for side in ("k", "v"):
        pieces = [p for lo, hi in spans for p in _gather(name, side, lo, hi, block, block_rows)]
        sides.append(mx.concatenate(pieces, axis=2))
    window = RotatingKVCache(max_size=fresh.max_size, keep=fresh.keep)
    window.keys, window.values = sides
    window.offset, window._idx = length, sides[0].shape[2]
    return window


def _recurrent(name: str, fresh: ArraysCache, state_arrays) -> ArraysCache:
    if state_arrays is None:
        raise ValueError("a recurrent layer needs the state at the boundary")
    restored = ArraysCache(len(fresh.cache))
    restored.cache = [state_arrays.get(f"{name}.{i}") for i in range(len(fresh.cache))]
    return restored


def _quantized_pieces(pieces: list, quantize: tuple[int, int]) -> list[tuple]:
    group_size, bits = quantize
    return [p if isinstance(p, tuple) else mx.quantize(p, group_size, bits) for p in pieces]


def _full(name, length, block, block_rows, quantize, head, head_length):
    """A full-attention layer: its rows, block after block (after the head's)."""
    pieces: dict[str, list] = {"k": [], "v": []}
    if head is not None and head_length:
        for side, held in (("k", head.keys), ("v", head.values)):
            if isinstance(held, (tuple, list)):
                pieces[side].append(tuple(a[..., :head_length, :] for a in held))
            else:
                pieces[side].append(held[..., :head_length, :])
    for index in range(head_length // block, length // block):
        arrays = block_rows(index)
        for side in ("k", "v"):
            if f"{name}.{side}" in arrays:
                pieces[side].append(arrays[f"{name}.{side}"])
            else:  # stored quantized: (packed, scales, biases)
                pieces[side].append(tuple(arrays[f"{name}.{side}.{i}"] for i in range(3)))
    if quantize is not None or any(isinstance(p, tuple) for p in pieces["k"]):
        if quantize is None:
            raise ValueError("quantized rows need the quantization's group size and bits")
        layer = QuantizedKVCache(group_size=quantize[0], bits=quantize[1])
        keys, values = (_quantized_pieces(pieces[s], quantize) for s in ("k", "v"))
        layer.keys = tuple(mx.concatenate([p[i] for p in keys], axis=2) for i in range(3))
        layer.values = tuple(mx.concatenate([p[i] for p in values], axis=2) for i in range(3))
    else:
        layer = KVCache()
        layer.keys = mx.concatenate(pieces["k"], axis=2)
        layer.values = mx.concatenate(pieces["v"], axis=2)
    layer.offset = length
    return layer
