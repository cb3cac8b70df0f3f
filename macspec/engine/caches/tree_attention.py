"""One forward pass over a token tree, through mlx-lm's own models (not forked).

mlx-lm's attention takes no mask argument: a model asks its first layer cache for
`make_mask(N)`, and rotates queries and keys at `cache.offset`. A tree pass changes both for its
duration, and nothing else:
- each attention cache's class becomes a subclass whose `make_mask` returns the tree's boolean
  mask: every row sees the committed ids, and among the ids of the pass only its own ancestors
  and itself;
- each rope module (class-swapped once, by `install`; inert outside a tree pass) rotates row i
  at its own position (root + depth), by moving the rows onto the batch axis, where
  `mx.fast.rope` takes one offset per row. That is bit-identical to sequential rope.
Weights, KV writes and quantized caches are mlx-lm's own. After the verdict, `keep_rows`
gathers the kept path's keys and values into contiguous slots.

`tree_ready` says in words why a model cannot take a tree pass: a cache that is not plain
attention (a recurrent state, a sliding window) or no rope to move. A model whose positions do
not come from its rope modules is caught by `check_tree_pass`, which compares one small tree
pass with sequential passes before a tree is ever verified.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import rope_utils
from mlx_lm.models.cache import ArraysCache, KVCache, QuantizedKVCache

from macspec.engine.caches import recurrent
from macspec.engine.caches import tree_recurrent as treerecurrent

_active = threading.local()
"""`.positions`: (M,) positions of the pass's rows relative to the cache's offset;
`.visible`: (M, T) which of the pass's last T columns each row sees (the ones before are all
seen); set only inside `tree_pass`."""

TREE_CACHES = (KVCache, QuantizedKVCache)
"""Caches whose rows are ids in order and whose keys can be gathered: attention layers."""

ROPE_CLASSES = (
    nn.RoPE,
    rope_utils.SuScaledRoPE,
    rope_utils.Llama3RoPE,
    rope_utils.YarnRoPE,
    rope_utils.ProportionalRoPE,
)
"""Rope modules whose `offset` is only where positions start (DynamicNTKScalingRoPE also
derives its base from it: not one of them)."""

_subclasses: dict[type, type] = {}


def _tree_rope(base: type) -> type:
    """A subclass of a rope class that, inside a tree pass, rotates each row at its own
    position."""

    def __call__(self, x, offset=0, *args, **kwargs):
        positions = getattr(_active, "positions", None)
        if (
            positions is not None
            and positions.ndim == 2
            and x.ndim == 4
            and x.shape[:3:2] == positions.shape
        ):
            # A batch's pass (b rows of m ids, each row its own offset): one batch row per id.
            b, heads, m, dim = x.shape
            rows = mx.swapaxes(x, 1, 2).reshape(b * m, heads, 1, dim)
            at = (offset[:, None] + positions).reshape(-1)
            out = base.__call__(self, rows, at, *args, **kwargs)
            return mx.swapaxes(out.reshape(b, m, heads, dim), 1, 2)
        if positions is None or x.shape[-2] != positions.size or x.shape[0] != 1:
            return base.__call__(self, x, offset, *args, **kwargs)
        # (1, heads, M, dim) -> (M, heads, 1, dim): one batch row per id, each its own offset.
        rows = mx.swapaxes(x, 0, -2)
        out = base.__call__(self, rows, offset + positions, *args, **kwargs)
        return mx.swapaxes(out, 0, -2)

    return type(f"Tree{base.__name__}", (base,), {"__call__": __call__})


def _tree_cache(base: type) -> type:
    """A subclass of an attention cache whose mask, inside a tree pass, is the tree's."""

    def make_mask(self, n, *args, **kwargs):
        visible = _active.visible
        seen = self.offset + n - visible.shape[1]  # committed columns, all seen
        return mx.concatenate([mx.ones((n, seen), mx.bool_), visible], axis=1)

    return type(f"Tree{base.__name__}", (base,), {"make_mask": make_mask})


def _subclass(base: type, make) -> type:
    if base not in _subclasses:
        _subclasses[base] = make(base)
    return _subclasses[base]


def install(model: nn.Module) -> int:
    """Make the model's rope modules tree-aware (a class swap: parameters untouched, nothing
    changes outside a tree pass); returns how many it has."""
    count = 0
    for _, module in model.named_modules():
        kind = type(module)
        if kind in _subclasses.values() and issubclass(kind, ROPE_CLASSES):
            count += 1
        elif kind in ROPE_CLASSES:
            module.__class__ = _subclass(kind, _tree_rope)
            count += 1
    return count


KINDS = {"ArraysCache": "recurrent", "RotatingKVCache": "sliding-window"}
"""What the caches a tree pass cannot take are, in words."""


def branches_recurrent(model: nn.Module, cache: Sequence[Any]) -> bool:
    """Whether every recurrent layer of the model is Gated DeltaNet, which a tree pass runs
    with one state per branch (`treerecurrent`); False without recurrent layers."""
    layers = sum(isinstance(c, ArraysCache) for c in cache)
    return layers > 0 and recurrent.install(model) == layers


def tree_ready(model: nn.Module, cache: Sequence[Any]) -> str | None:
    """None when the model can take a tree pass with this cache; else why not, in words
    ('has recurrent layers (ArraysCache)')."""
    branching = (ArraysCache,) if branches_recurrent(model, cache) else ()
    kinds = TREE_CACHES + branching
    others = sorted({type(c).__name__ for c in cache if not isinstance(c, kinds)})
    if others:
        named = ", ".join(f"{KINDS.get(name, 'other')} layers ({name})" for name in others)
        return f"has {named}, which one tree pass cannot branch"
    if install(model) == 0:
        return "has no rope module to place tree nodes at their depth"
    return None


@contextmanager
def tree_pass(
    cache: Sequence[Any], positions: mx.array, visible: mx.array, parents: list[int] | None = None
) -> Iterator[treerecurrent.TreeRecord | None]:
    """Run the block's forward pass as a tree: row i at `positions[i]` after the cache's offset,
    seeing every committed id and the pass's columns where `visible[i]` is set. A model with
    Gated DeltaNet layers also needs each row's parent row (`parents`, -1: the state before);
    it yields the record `keep_rows` then needs."""
    record = None
    if any(isinstance(c, ArraysCache) for c in cache):
        if parents is None:
            raise ValueError("a tree pass through recurrent layers needs the rows' parents")
        record = treerecurrent.rows_of(parents)
    swapped = []
    for layer_cache in cache:
        kind = type(layer_cache)
        if kind in TREE_CACHES:
            layer_cache.__class__ = _subclass(kind, _tree_cache)
            swapped.append((layer_cache, kind))
    _active.positions, _active.visible = positions, visible
    try:
        if record is None:
            yield None
        else:
            with treerecurrent.tree_rows(record):
                yield record
    finally:
        _active.positions = _active.visible = None
        for layer_cache, kind in swapped:
            layer_cache.__class__ = kind


@contextmanager
def rows_positions(positions: mx.array) -> Iterator[None]:
    """Inside the block, the rope of a batch's pass (rows of ids, each row at its own offset,
    engine/batch/tree.py) rotates id j of row b at `positions[b, j]` after the row's offset."""
    _active.positions = positions
    try:
        yield
    finally:
        _active.positions = None


def keep_rows(
    cache: Sequence[Any], start: int, rows: Sequence[int],
    record: treerecurrent.TreeRecord | None = None, path: Sequence[int] = (),
) -> None:  # fmt: skip
    """After a tree pass that filled slots from `start` on: keep `rows` (slot numbers counted
    from `start`, in order) as slots start, start + 1, ..., and forget the others (the next pass
    writes over them). Recurrent layers take the state after the pass rows `path` (the kept
    chain of rows, from the first), recomputed from the pass's `record`."""
    index = None
    if any(row != i for i, row in enumerate(rows)):
        index = mx.array([start + row for row in rows], mx.int32)
    recurrent_layers = [c for c in cache if isinstance(c, ArraysCache)]
    for i, layer_cache in enumerate(recurrent_layers):
        update = recurrent.original_update()
        layer_cache[0], layer_cache[1] = treerecurrent.kept_states(record, i, path, update)
    for layer_cache in cache:
        if isinstance(layer_cache, ArraysCache):
            continue
        if index is not None:
            # Quantized caches hold (packed, scales, biases): each part moves alike.
            for group in (layer_cache.keys, layer_cache.values):
                for array in group if isinstance(group, (tuple, list)) else (group,):
                    array[..., start : start + len(rows), :] = mx.take(array, index, axis=-2)
        layer_cache.offset = start + len(rows)


def check_tree_pass(model: nn.Module, cache: list[Any], ids: Sequence[int]) -> str | None:
    """Compare one small tree pass with the sequential pass it stands for, on a fresh `cache`;
    None when they agree, else why not. `ids`: at least 3 ids of real text."""
    prefix, a, b = list(ids[:-2]), ids[-2], ids[-1]
    if len(prefix) > 1:
        model(mx.array(prefix[:-1])[None], cache=cache)
    # The root, then two siblings a and b at depth 1: b sees the root and itself, not a.
    tree = mx.array([prefix[-1], a, b], mx.uint32)[None]
    positions = mx.array([0, 1, 1], mx.int32)
    visible = mx.array([[True, False, False], [True, True, False], [True, False, True]])
    with tree_pass(cache, positions, visible, parents=[-1, 0, 0]):
        got = model(tree, cache=cache)[0, -1]
    want = model(mx.array(prefix + [b])[None])[0, -1]
    scale = mx.abs(want).max().item() or 1.0
    error = mx.abs(got - want).max().item() / scale
    if error > 1e-3:
        return f"a tree pass does not match a sequential one (relative error {error:.1e})"
    return None
