"""A tree pass through Gated DeltaNet layers (Qwen3.5/3.6, Qwen3-Next): one state per branch.

A recurrent layer cannot see a tree through a mask: its state after a node is its state after
the node's parent, updated with the node's own inputs. So, while a tree pass runs, the two
places `recurrent.py` already hooks (the layer's `conv1d`, and `gated_delta_update`) compute
the tree instead of the flattened sequence, without forking mlx-lm's layer:
- the convolution of each row reads the rows of its own path (its ancestors, then the conv
  state before the pass), through the layer's own Conv1d over one window per row;
- the delta rule runs level by level: every row of a level starts from its parent's state, all
  rows of the level in one batched `gated_delta_update`.
What they consumed is recorded, and after the verdict the kept path's states are recomputed
from the record alone (as `recurrent.states_after` does for a chain), so only one level's
states are alive at a time during the pass. Trees need their shape on the host here (the levels
are built from it): a recurrent target verifies fixed shapes, never DDTree's.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import mlx.core as mx

_active = threading.local()


@dataclass
class TreeRecord:
    """A tree pass: each row's parent row (-1: the state before the pass), rows by level, and
    what each Gated DeltaNet layer consumed, in layer order."""

    parents: list[int]
    levels: list[list[int]]
    convs: list[tuple[mx.array, list[list[int]]]] = field(default_factory=list)
    """Each layer's conv input (state rows, then the pass's) and each row's window into it."""
    deltas: list[tuple[tuple, dict]] = field(default_factory=list)
    """Each layer's `gated_delta_update` arguments."""


def rows_of(parents: Sequence[int]) -> TreeRecord:
    """A record for a pass whose row i has parent row parents[i] (-1: the state before)."""
    depth: list[int] = []
    for parent in parents:
        depth.append(0 if parent < 0 else depth[parent] + 1)
    levels = [[r for r, d in enumerate(depth) if d == level] for level in range(max(depth) + 1)]
    return TreeRecord(list(parents), levels)


@contextmanager
def tree_rows(record: TreeRecord) -> Iterator[TreeRecord]:
    """Gated DeltaNet layers run inside the block compute the tree `record` describes."""
    _active.record = record
    try:
        yield record
    finally:
        _active.record = None


def active() -> TreeRecord | None:
    return getattr(_active, "record", None)


def _window(record: TreeRecord, row: int, kernel: int) -> list[int]:
    """Indices into the conv input of the `kernel` inputs ending at `row`, oldest first: its
    ancestors' rows, then the conv state's rows, newest first."""
    held = kernel - 1  # the conv state's rows lead the conv input
    back, at, state_row = [], row, held - 1
    while len(back) < kernel:
        if at >= 0:
            back.append(held + at)
            at = record.parents[at]
        else:
            back.append(state_row)
            state_row -= 1
    return back[::-1]


def tree_conv(conv, x: mx.array, call) -> mx.array:
    """The layer's Conv1d over the tree: x (1, kernel - 1 + M, C) -> (1, M, C); `call` is the
    module's own convolution (one window per row, batched)."""
    record = active()
    if isinstance(record, RowsTreeRecord):
        return rows_conv(record, x, call)
    rows = len(record.parents)
    kernel = x.shape[1] - rows + 1
    windows = [_window(record, r, kernel) for r in range(rows)]
    record.convs.append((x, windows))
    out = call(x[0][mx.array(windows, mx.int32)])  # (M, 1, C): one output per window
    return out.reshape(1, rows, -1)


def tree_delta(update, args: tuple, kwargs: dict) -> tuple[mx.array, mx.array]:
    """`gated_delta_update` over the tree, level by level from each row's parent's state."""
    record = active()
    if isinstance(record, RowsTreeRecord):
        return rows_delta(record, update, args, kwargs)
    record.deltas.append((args, kwargs))
    q, k, v, a, b, a_log, dt_bias = args[:7]
    state = args[7] if len(args) > 7 else kwargs.get("state")
    rest = {key: value for key, value in kwargs.items() if key not in ("state", "mask")}
    if state is None:
        state = mx.zeros((1, v.shape[-2], v.shape[-1], k.shape[-1]), mx.float32)
    outs, previous, where = [], state, {-1: 0}
    for level in record.levels:
        start = mx.array([where[record.parents[r]] for r in level], mx.int32)
        rows = mx.array(level, mx.int32)
        out, states = update(
            *(t[0][rows][:, None] for t in (q, k, v, a, b)), a_log, dt_bias, previous[start],
            None, **rest,
        )  # fmt: skip
        outs.append(out[:, 0])
        previous, where = states, {r: i for i, r in enumerate(level)}
    return mx.concatenate(outs, axis=0)[None], previous[-1:]


def kept_states(record: TreeRecord, index: int, path: Sequence[int], update) -> tuple:
    """(conv state, delta-rule state) of the `index`-th recorded layer after the rows of
    `path` (a root-to-node chain of rows), recomputed from the record."""
    x, windows = record.convs[index]
    conv = mx.contiguous(x[:, mx.array(windows[path[-1]][1:], mx.int32)])
    args, kwargs = record.deltas[index]
    q, k, v, a, b, a_log, dt_bias = args[:7]
    state = args[7] if len(args) > 7 else kwargs.get("state")
    rest = {key: value for key, value in kwargs.items() if key not in ("state", "mask")}
    rows = mx.array(list(path), mx.int32)
    _, state = update(*(t[:, rows] for t in (q, k, v, a, b)), a_log, dt_bias, state, None, **rest)
    return conv, state


# -- a batch's pass: every batch row with its own tree (engine/batch/tree.py) -------------------
@dataclass
class RowsTreeRecord:
    """A batch's pass over trees: `parents[b][r]`, the parent pass row of row b's pass row r
    (-1: the state before); chains are trees without branches, padding continues a chain."""

    parents: list[list[int]]
    convs: list[tuple[mx.array, mx.array]] = field(default_factory=list)
    """Each layer's conv input and each pass row's window into it, (B, M, kernel) flat."""
    deltas: list[tuple[tuple, dict]] = field(default_factory=list)

    def levels(self) -> list[tuple[list[int], list[int], list[int]]]:
        """By depth: (batch rows, pass rows, where each one's start state is: its batch row's
        state before the pass (< B), else B + its parent's place in the previous level)."""
        depth = [[0] * len(row) for row in self.parents]
        for row, parents in zip(depth, self.parents):
            for r, parent in enumerate(parents):
                row[r] = 0 if parent < 0 else row[parent] + 1
        rows, out, previous = len(self.parents), [], {}
        for level in range(max(max(d) for d in depth) + 1):
            items = [(b, r) for b in range(rows) for r, d in enumerate(depth[b]) if d == level]
            starts = [
                b if self.parents[b][r] < 0 else rows + previous[(b, self.parents[b][r])]
                for b, r in items
            ]
            out.append(([b for b, _ in items], [r for _, r in items], starts))
            previous = {item: i for i, item in enumerate(items)}
        return out


def rows_conv(record: RowsTreeRecord, x: mx.array, call) -> mx.array:
    """x (B, kernel - 1 + M, C) -> (B, M, C): each pass row's window along its own path."""
    rows, length, channels = x.shape
    m = len(record.parents[0])
    kernel = length - m + 1
    windows = mx.array(
        [
            [
                [b * length + i for i in _window(TreeRecord(parents, []), r, kernel)]
                for r in range(m)
            ]
            for b, parents in enumerate(record.parents)
        ],
        mx.int32,
    )
    record.convs.append((x, windows))
    out = call(x.reshape(rows * length, channels)[windows.reshape(rows * m, kernel)])
    return out.reshape(rows, m, -1)


def rows_delta(record: RowsTreeRecord, update, args: tuple, kwargs: dict):
    """`gated_delta_update` over every batch row's tree, level by level, all rows at once."""
    record.deltas.append((args, kwargs))
    q, k, v, a, b, a_log, dt_bias = args[:7]
    state = args[7] if len(args) > 7 else kwargs.get("state")
    rest = {key: value for key, value in kwargs.items() if key not in ("state", "mask")}
    rows, m = q.shape[:2]
    if state is None:
        state = mx.zeros((rows, v.shape[-2], v.shape[-1], k.shape[-1]), mx.float32)
    outs, order, pool = [], [], state
    for batch_rows, pass_rows, starts in record.levels():
        at = (mx.array(batch_rows, mx.int32), mx.array(pass_rows, mx.int32))
        out, states = update(
            *(t[at][:, None] for t in (q, k, v, a, b)), a_log, dt_bias,
            pool[mx.array(starts, mx.int32)], None, **rest,
        )  # fmt: skip
        outs.append(out[:, 0])
        order += [row * m + r for row, r in zip(batch_rows, pass_rows)]
        pool = mx.concatenate([state, states])
    flat = mx.concatenate(outs)[mx.argsort(mx.array(order, mx.int32))]
    return flat.reshape(rows, m, *flat.shape[1:]), state  # the kept states: `rows_kept`


def rows_kept(record: RowsTreeRecord, index: int, row: int, path: Sequence[int], update):
    """(conv state, delta-rule state), batch row `row` of one, of the `index`-th recorded layer
    after its pass rows `path` (a chain from its first row), recomputed from the record."""
    x, windows = record.convs[index]
    flat = x.reshape(-1, x.shape[-1])
    conv = mx.contiguous(flat[windows[row, path[-1], 1:]][None])
    args, kwargs = record.deltas[index]
    q, k, v, a, b, a_log, dt_bias = args[:7]
    state = args[7] if len(args) > 7 else kwargs.get("state")
    state = None if state is None else state[row : row + 1]
    rest = {key: value for key, value in kwargs.items() if key not in ("state", "mask")}
    steps = mx.array(list(path), mx.int32)
    one = slice(row, row + 1)
    _, state = update(*(t[one][:, steps] for t in (q, k, v, a, b)), a_log, dt_bias, state, None,
                      **rest)  # fmt: skip
    return conv, state
