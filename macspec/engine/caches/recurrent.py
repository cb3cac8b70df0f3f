"""Exact rollback of Gated DeltaNet layers (Qwen3.5/3.6, Qwen3-Next) to any point of a pass.

A checkpoint restore returns a recurrent layer to the start of the verify pass, and the kept
guesses must then be fed again. For Gated DeltaNet there is a cheaper way: record, during the
pass, what the layer's recurrence consumed (its convolution's input and the arguments of
`gated_delta_update`); the state after the first p ids of the pass is then recomputed from them
alone, with no weight read: the convolution state is p rows further along the recorded input,
and the delta-rule state is the same update run over the first p steps. The recorded arrays are
the ones the pass computed anyway, so recording costs no extra work.

Recording hooks two places of mlx-lm's own classes, without forking them: the layer's `conv1d`
becomes a subclass that notes its input (a class swap: its parameters are untouched), and the
module-level `gated_delta_update` of the modules that define these layers is wrapped. Both only
note arrays while a `recording` block is active on the current thread.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from macspec.engine.caches import tree_recurrent as treerecurrent

MODULES = ("mlx_lm.models.qwen3_5", "mlx_lm.models.qwen3_next")
"""mlx-lm modules whose linear-attention layers keep [conv state, delta-rule state] in an
ArraysCache, fill it from `conv1d(concat(conv_state, x))` and `gated_delta_update`."""

_active = threading.local()


@dataclass
class PassRecord:
    """What each Gated DeltaNet layer's recurrence consumed in one forward pass, in layer order."""

    convs: list[mx.array] = field(default_factory=list)
    """Each layer's convolution input: its conv state before the pass, then the pass's rows."""
    deltas: list[tuple[tuple, dict]] = field(default_factory=list)
    """Each layer's `gated_delta_update` arguments."""


class _RecordingConv1d(nn.Conv1d):
    def __call__(self, x: mx.array) -> mx.array:
        if treerecurrent.active() is not None:  # a tree pass: each row along its own path
            return treerecurrent.tree_conv(self, x, super().__call__)
        record = getattr(_active, "record", None)
        if record is not None:
            record.convs.append(x)
        return super().__call__(x)


def _recording(update):
    def gated_delta_update(*args, **kwargs):
        if treerecurrent.active() is not None:  # a tree pass: each row from its parent's state
            return treerecurrent.tree_delta(update, args, kwargs)
        record = getattr(_active, "record", None)
        if record is not None:
            record.deltas.append((args, kwargs))
        return update(*args, **kwargs)

    gated_delta_update.original = update
    return gated_delta_update


def _patch_modules() -> None:
    for name in MODULES:
        module = importlib.import_module(name)
        update = getattr(module, "gated_delta_update", None)
        if update is not None and not hasattr(update, "original"):
            module.gated_delta_update = _recording(update)


def install(model: nn.Module) -> int:
    """Make the model's Gated DeltaNet layers recordable; returns how many it has."""
    layers = [
        m
        for _, m in model.named_modules()
        if type(m).__module__ in MODULES
        and hasattr(m, "A_log")
        and type(getattr(m, "conv1d", None)) in (nn.Conv1d, _RecordingConv1d)
    ]
    if layers:
        _patch_modules()
        for layer in layers:
            layer.conv1d.__class__ = _RecordingConv1d
    return len(layers)


@contextmanager
def recording(record: PassRecord) -> Iterator[PassRecord]:
    """Note what Gated DeltaNet layers consume while the block runs (on this thread)."""
    _active.record = record
    try:
        yield record
    finally:
        _active.record = None


def states_after(
    record: PassRecord, index: int, kept: int, row: int | None = None
) -> tuple[mx.array, Any]:
    """(conv state, delta-rule state) of the `index`-th recorded layer after the first `kept`
    ids of the pass, recomputed from what the pass recorded; with `row`, of that row of a
    batched pass (its first `kept` ids are its own, never padding)."""
    args, kwargs = record.deltas[index]
    q, k, v, a, b, a_log, dt_bias = args[:7]
    state = args[7] if len(args) > 7 else kwargs.get("state")
    conv_input = record.convs[index]
    if row is not None:
        one = slice(row, row + 1)
        q, k, v, a, b = (x[one] for x in (q, k, v, a, b))
        state = None if state is None else state[one]
        conv_input = conv_input[one]
    width = conv_input.shape[1] - q.shape[1]  # the conv state's rows: kernel size - 1
    conv = mx.contiguous(conv_input[:, kept : kept + width, :])
    if kept == 0:
        return conv, state
    rest = {key: value for key, value in kwargs.items() if key not in ("state", "mask")}
    update = original_update()
    _, state = update(
        q[:, :kept], k[:, :kept], v[:, :kept], a[:, :kept], b[:, :kept], a_log, dt_bias, state,
        None, **rest,
    )  # fmt: skip
    return conv, state


def usable(record: PassRecord, layers: int, fed: int) -> bool:
    """Whether a record describes `layers` recurrent layers over a pass of `fed` ids, unmasked."""
    if len(record.convs) != layers or len(record.deltas) != layers:
        return False
    for args, kwargs in record.deltas:
        mask = args[8] if len(args) > 8 else kwargs.get("mask")
        if mask is not None or args[0].shape[1] != fed:
            return False
    return True


def original_update():
    """mlx-lm's own `gated_delta_update` (not the recording wrapper)."""
    module = importlib.import_module(MODULES[0])
    update = module.gated_delta_update
    return getattr(update, "original", update)
