"""Attention caches for several sequences (rows) decoded together, each at its own length.

One buffer per layer holds every row, right-padded: row b's ids sit in columns [0, length_b).
A pass feeds each row its own ids (padded to the widest row); they are written at each row's
own length, rope takes each row's length as its offset, and the mask lets a row's queries see
only its own ids, causally (and within the window for sliding-window layers). Rolling a row
back is setting its length: what was written beyond it is never seen and is overwritten by
the next pass. So every row is verified, accepted and rolled back on its own, exactly, at the
cost of one pass for all of them.

mlx-lm's `BatchKVCache` keeps one length for all rows (left padding), so a per-row rollback
there means rolling each row's data into its padding; writing at per-row offsets avoids that
copy. Sliding windows keep their whole history here (the mask applies the window), so a row
never needs a checkpoint to roll back.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache, KVCache, RotatingKVCache

ROW_CACHES = (KVCache, RotatingKVCache, ArraysCache)
"""Layer caches a batch of rows can hold: attention, with or without a window, and recurrent
state (Gated DeltaNet, Mamba, short convolutions)."""


class RowsKVCache:
    """One attention layer's keys and values for `rows` sequences, each at its own length."""

    step = 256

    def __init__(self, window: int | None = None):
        self.rows = 0
        self.window = window
        """A sliding-window layer's window (None: full attention)."""
        self.keys: mx.array | None = None
        self.values: mx.array | None = None
        self.lengths: list[int] = []
        self.fetched = 0
        """How many columns the last update_and_fetch returned."""
        self.offset = mx.zeros((0,), mx.int32)
        """Each row's length: where its next ids go, and their rope offset."""
        self.tree: tuple[mx.array, mx.array] | None = None
        """Inside a pass over trees (engine/batch/tree.py): each pass id's position after its
        row's length (rows, n), and which of its row's pass ids it sees (rows, n, n)."""

    def set_lengths(self, lengths: list[int]) -> None:
        self.lengths = list(lengths)
        self.offset = mx.array(self.lengths, mx.int32)

    def _room(self, needed: int, like: mx.array, like_values: mx.array) -> None:
        held = 0 if self.keys is None else self.keys.shape[2]
        if needed <= held:
            return
        grow = -(-(needed - held) // self.step) * self.step
        b, h, _, dk = like.shape
        more_k = mx.zeros((b, h, grow, dk), like.dtype)
        more_v = mx.zeros((b, h, grow, like_values.shape[3]), like_values.dtype)
        if self.keys is None:
            self.keys, self.values = more_k, more_v
        else:
            self.keys = mx.concatenate([self.keys, more_k], axis=2)
            self.values = mx.concatenate([self.values, more_v], axis=2)

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        """Write each row's new ids at its own length; all rows' keys and values, as wide as
        the longest row after this pass."""
        width = keys.shape[2]
        end = max(self.lengths, default=0) + width
        self._room(end, keys, values)
        columns = self.offset[:, None] + mx.arange(width)
        self.keys = put_columns(self.keys, columns, keys)
        self.values = put_columns(self.values, columns, values)
        self.fetched = end
        return self.keys_and_values()

    def keys_and_values(self) -> tuple[mx.array, mx.array]:
        """What the pass's update_and_fetch gave: Gemma 3n's last layers read the keys and
        values of an earlier layer's cache, after it, in the same pass."""
        return self.keys[..., : self.fetched, :], self.values[..., : self.fetched, :]

    def make_mask(
        self, n: int, return_array: bool = False, window_size: int | None = None
    ) -> mx.array:
        """(rows, 1, n, longest + n): query i of row b sees the row's columns up to its own
        position, and no further back than the window."""
        window = window_size or self.window
        if self.tree is not None:
            return self._tree_mask(n, window)
        queries = self.offset[:, None] + mx.arange(n)  # (rows, n) absolute positions
        columns = mx.arange(max(self.lengths, default=0) + n)
        mask = columns[None, None, :] <= queries[:, :, None]
        if window is not None:
            mask = mask & (columns[None, None, :] > queries[:, :, None] - window)
        return mask[:, None]

    def _tree_mask(self, n: int, window: int | None) -> mx.array:
        """A pass over trees: a row's ids see its committed columns and, among its pass
        columns, what `tree` says; a window counts back from each id's own position."""
        positions, visible = self.tree
        columns = mx.arange(max(self.lengths, default=0) + n)
        after = columns[None, :] - self.offset[:, None]  # (rows, columns): from each row's length
        committed = after < 0
        index = mx.clip(after, 0, n - 1)
        sees = mx.take_along_axis(
            visible, mx.broadcast_to(index[:, None], (*visible.shape[:2], index.shape[1])), axis=2
        )
        mask = committed[:, None, :] | (sees & (after < n)[:, None, :])
        if window is not None:
            keys = mx.where(
                committed,
                columns[None, :],
                self.offset[:, None] + mx.take_along_axis(positions, index, axis=1),
            )
            queries = self.offset[:, None] + positions
            mask = mask & (keys[:, None, :] > queries[:, :, None] - window)
        return mask[:, None]

    def keep_path(self, row: int, start: int, path: list[int]) -> None:
        """After a pass over trees: row `row`'s pass columns `start + path[i]` move to
        `start + i` (its kept path, contiguous); the caller sets the row's length."""
        if all(node == i for i, node in enumerate(path)):
            return
        index = mx.array([start + node for node in path], mx.int32)
        end = start + len(path)
        for name in ("keys", "values"):
            buffer = getattr(self, name)
            buffer[row : row + 1, :, start:end, :] = mx.take(buffer[row : row + 1], index, axis=2)

    # -- rows in and out -----------------------------------------------------------------------
    def add_row(self, layer_cache: Any) -> None:
        """Append a row: a one-sequence cache (a request prefilled alone)."""
        length = int(layer_cache.offset)
        if layer_cache.keys is None:  # a one-id prompt: nothing prefilled, its id comes next
            self._add_empty_row()
            return
        keys, values = layer_keys_values(layer_cache)
        held = keys.shape[2]
        width = max([length, *self.lengths, 1])
        width = -(-width // self.step) * self.step
        if self.keys is not None:
            width = max(width, self.keys.shape[2])
        b, h, _, dk = keys.shape
        row_k = mx.zeros((1, h, width, dk), keys.dtype)
        row_v = mx.zeros((1, h, width, values.shape[3]), values.dtype)
        start = length - held  # a window holds only its newest ids; older ones are never seen
        row_k[..., start:length, :] = keys
        row_v[..., start:length, :] = values
        if self.keys is None:
            self.keys, self.values = row_k, row_v
        else:
            if self.keys.shape[2] < width:
                self._room(width, self.keys, self.values)
            self.keys = mx.concatenate([self.keys, row_k], axis=0)
            self.values = mx.concatenate([self.values, row_v], axis=0)
        self.rows += 1
        self.set_lengths([*self.lengths, length])

    def _add_empty_row(self) -> None:
        """A row that holds no ids yet: zeros as wide as the others (none while no row holds
        any: the next pass sizes the buffers for all)."""
        if self.keys is not None:
            self.keys = mx.concatenate([self.keys, mx.zeros_like(self.keys[:1])], axis=0)
            self.values = mx.concatenate([self.values, mx.zeros_like(self.values[:1])], axis=0)
        self.rows += 1
        self.set_lengths([*self.lengths, 0])

    def keep_rows(self, kept: list[int]) -> None:
        """Only rows `kept` (indices, in order) remain."""
        if self.keys is not None:
            index = mx.array(kept, mx.int32)
            self.keys, self.values = self.keys[index], self.values[index]
        self.rows = len(kept)
        self.set_lengths([self.lengths[i] for i in kept])
        if not kept:
            self.keys = self.values = None

    def row_cache(self, row: int, length: int | None = None) -> Any:
        """Row `row`'s first `length` ids (default: all) as a one-sequence cache of mlx-lm's
        own kind (to save, or to continue alone)."""
        length = self.lengths[row] if length is None else length
        if self.window is None:
            cache = KVCache()
            if length:  # copies: a slice would keep the whole batch's buffer alive
                cache.keys = mx.contiguous(self.keys[row : row + 1, :, :length, :])
                cache.values = mx.contiguous(self.values[row : row + 1, :, :length, :])
            cache.offset = length
            return cache
        cache = RotatingKVCache(max_size=self.window, keep=0)
        held = min(length, self.window)
        if held:
            cache.keys = mx.contiguous(self.keys[row : row + 1, :, length - held : length, :])
            cache.values = mx.contiguous(self.values[row : row + 1, :, length - held : length, :])
        cache.offset, cache._idx = length, held
        return cache


def put_columns(buffer: mx.array, columns: mx.array, new: mx.array) -> mx.array:
    """buffer[b, :, columns[b, j], :] = new[b, :, j, :] for every row b, in one scatter."""
    b, h, width, d = new.shape
    index = mx.broadcast_to(columns[:, None, :, None], (b, h, width, d))
    return mx.put_along_axis(buffer, index, new, axis=2)


def layer_keys_values(layer_cache: Any) -> tuple[mx.array, mx.array]:
    """A one-sequence layer cache's held keys and values, oldest first."""
    if isinstance(layer_cache, RotatingKVCache):
        keys = layer_cache._temporal_order(layer_cache.keys)
        values = layer_cache._temporal_order(layer_cache.values)
        held = min(layer_cache.offset, keys.shape[2])
        return keys[..., keys.shape[2] - held :, :], values[..., values.shape[2] - held :, :]
    length = layer_cache.offset
    return layer_cache.keys[..., :length, :], layer_cache.values[..., :length, :]


class RowsArraysCache(ArraysCache):
    """A recurrent layer's state for every row (mlx-lm's ArraysCache, batched on axis 0).

    A pass over rows of different widths sets `lengths` (the model's own masking keeps the
    padding out of the state); a row that keeps fewer ids than it fed returns to its state
    before the pass (`restore_rows`) and feeds the kept ids again next time.
    """

    def __init__(self, size: int):
        super().__init__(size)
        self.rows = 0

    def add_row(self, layer_cache: ArraysCache) -> None:
        state = list(layer_cache.cache)
        if self.rows == 0:
            self.cache = state
        else:
            self.cache = [stack_state(a, b, self.rows) for a, b in zip(self.cache, state)]
        self.rows += 1

    def keep_rows(self, kept: list[int]) -> None:
        index = mx.array(kept, mx.int32)
        self.cache = [None if a is None or not kept else a[index] for a in self.cache]
        self.rows = len(kept)

    def row_cache(self, row: int, length: int | None = None) -> ArraysCache:
        cache = ArraysCache(len(self.cache))
        cache.cache = [None if a is None else mx.contiguous(a[row : row + 1]) for a in self.cache]
        return cache

    def set_lengths(self, lengths: list[int]) -> None:
        """Rows' lengths say nothing to a recurrent state (it holds no columns)."""

    def prepare_pass(self, widths: list[int], width: int) -> list:
        """Before a pass over rows feeding `widths` ids (padded to `width`): the state now."""
        self.lengths = mx.array(widths) if min(widths) < width else None
        self.left_padding = None
        return list(self.cache)

    def end_pass(self) -> None:
        self.lengths = self.left_padding = None  # the model's advance() moved them

    def restore_rows(self, before: list, rows: list[bool]) -> None:
        """Rows marked True return to their state `before` the pass. A state that did not
        exist before it (None: every row joined with nothing fed, one-id prompts) was zeros
        for every row, as the model starts one: marked rows return to zeros, not keep what
        the pass fed them."""
        if not any(rows):
            return
        marked = mx.array(rows)
        self.cache = [
            a
            if a is None
            else mx.where(
                marked.reshape((-1,) + (1,) * (a.ndim - 1)), mx.zeros_like(a) if b is None else b, a
            )
            for a, b in zip(self.cache, before)
        ]


def rows_caches(model_cache: list[Any]) -> list[RowsKVCache | RowsArraysCache] | None:
    """Empty batch caches for a model whose one-sequence cache is `model_cache`; None when a
    layer's cache cannot be batched this way (quantized, chunked or composite caches)."""
    if not all(type(c) in ROW_CACHES for c in model_cache):
        return None
    caches: list[RowsKVCache | RowsArraysCache] = []
    for c in model_cache:
        if isinstance(c, ArraysCache):
            caches.append(RowsArraysCache(len(c.cache)))
        else:
            caches.append(RowsKVCache(c.max_size if isinstance(c, RotatingKVCache) else None))
    return caches


def stack_state(rows_state: mx.array | None, row_state: mx.array | None, rows: int) -> Any:
    """`rows` rows' recurrent state with one more row's below it. A state not yet made (None:
    a row that fed nothing, a one-id prompt) is zeros, as mlx-lm's models start it, so each
    row keeps its own place."""
    if rows_state is None and row_state is None:
        return None
    if rows_state is None:
        rows_state = mx.zeros((rows, *row_state.shape[1:]), row_state.dtype)
    if row_state is None:
        row_state = mx.zeros_like(rows_state[:1])
    return mx.concatenate([rows_state, row_state])
