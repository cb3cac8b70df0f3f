"""Hidden states from the target's own forward pass, for drafters that read them.

An MTP head reads the final post-norm hidden state (what the LM head sees); a DFlash drafter
reads the outputs of a few decoder layers, before the final norm. Both come from the pass the
target runs anyway: the final norm and the tapped layers become subclasses of their own classes
that note their output while a recording is active (a class swap of those module instances,
as `recurrent.py` does for convolutions: parameters and outputs are untouched, mlx-lm's model
classes are not forked).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import mlx.core as mx
import mlx.nn as nn

from macspec.errors import MacspecError

_active = threading.local()
_subclasses: dict[type, type] = {}


@dataclass(frozen=True)
class HiddenSpec:
    """What a drafter needs from each target pass."""

    final: bool = False
    """The final post-norm hidden state (the LM head's input), as an MTP head reads it."""
    layers: tuple[int, ...] = ()
    """Outputs of these decoder layers (0-based), before the final norm, as DFlash reads them."""

    def union(self, other: HiddenSpec) -> HiddenSpec:
        """What two drafters need together."""
        layers = tuple(sorted(set(self.layers) | set(other.layers)))
        return HiddenSpec(self.final or other.final, layers)


@dataclass
class Hidden:
    """One pass's hidden states, one row per id fed."""

    final: mx.array | None = None
    """(ids, hidden) post-norm, when asked for."""
    layers: dict[int, mx.array] = field(default_factory=dict)
    """(ids, hidden) per tapped layer, by layer index."""


class _Recording:
    def __init__(self, names: dict[int, object]):
        self.names = names
        self.outputs: dict[object, mx.array] = {}


def _recording_class(base: type) -> type:
    """A subclass of `base` whose instances note their output while a recording is active."""
    if base in _subclasses.values():
        return base
    if base not in _subclasses:

        def __call__(self, *args, **kwargs):
            out = base.__call__(self, *args, **kwargs)
            recording = getattr(_active, "recording", None)
            if recording is not None and id(self) in recording.names and isinstance(out, mx.array):
                recording.outputs[recording.names[id(self)]] = out
            return out

        _subclasses[base] = type(f"Tapped{base.__name__}", (base,), {"__call__": __call__})
    return _subclasses[base]


def inner_model(model: nn.Module) -> nn.Module:
    """The decoder stack of an mlx-lm model (`model.model`, or a VLM wrapper's)."""
    for path in ("model", "language_model.model"):
        node = model
        for part in path.split("."):
            node = getattr(node, part, None)
        if node is not None and hasattr(node, "norm"):
            return node
    raise MacspecError(f"cannot find the decoder stack of a {type(model).__name__} model")


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    layers = getattr(model, "layers", None)
    return list(layers) if layers is not None else list(inner_model(model).layers)


class Taps:
    """Taps installed on one model: run a forward pass inside `record()` to get its Hidden."""

    def __init__(self, model: nn.Module, spec: HiddenSpec):
        self.spec = spec
        layers = decoder_layers(model)
        bad = [i for i in spec.layers if not 0 <= i < len(layers)]
        if bad:
            raise MacspecError(
                f"the drafter reads target layer {bad[0]}, but the target has {len(layers)} "
                f"decoder layers (0 to {len(layers) - 1})"
            )
        self.names: dict[int, object] = {}
        tapped = [(i, layers[i]) for i in spec.layers]
        if spec.final:
            tapped.append(("final", inner_model(model).norm))
        for name, module in tapped:
            module.__class__ = _recording_class(type(module))
            self.names[id(module)] = name

    @contextmanager
    def record(self, batch: bool = False) -> Iterator[Hidden]:
        """Note the tapped outputs of the forward pass run inside the block: (ids, hidden)
        each, or with `batch` (rows, ids, hidden) for a pass over several rows."""
        recording = _Recording(self.names)
        hidden = Hidden()
        _active.recording = recording
        pick = slice(None) if batch else 0
        try:
            yield hidden
        finally:
            _active.recording = None
            out = recording.outputs
            if self.spec.final and "final" in out:
                hidden.final = out["final"][pick]
            hidden.layers = {i: out[i][pick] for i in self.spec.layers if i in out}


class HiddenRows:
    """Hidden states of a sequence by absolute position, kept as the passes wrote them."""

    def __init__(self) -> None:
        self._segments: list[tuple[int, mx.array]] = []

    def add(self, start: int, rows: mx.array) -> None:
        """Rows for positions start, start + 1, ...; they replace anything from `start` on."""
        self.truncate(start)
        self._segments.append((start, rows))

    def truncate(self, end: int) -> None:
        """Forget positions from `end` on."""
        kept = []
        for start, rows in self._segments:
            if start >= end:
                continue
            kept.append((start, rows if start + rows.shape[0] <= end else rows[: end - start]))
        self._segments = kept

    def forget_before(self, position: int) -> None:
        """Drop whole segments that end before `position` (memory; they are not needed)."""
        self._segments = [(s, r) for s, r in self._segments if s + r.shape[0] > position]

    def end(self) -> int:
        """One past the last position held."""
        return max((s + r.shape[0] for s, r in self._segments), default=0)

    def covered_from(self, hi: int) -> int | None:
        """The first position from which every position up to `hi` (excluded) is held; None
        when position hi - 1 is not."""
        lo = hi
        for start, rows in sorted(self._segments, key=lambda x: -(x[0] + x[1].shape[0])):
            if start < lo <= start + rows.shape[0]:
                lo = start
        return lo if lo < hi else None

    def has(self, lo: int, hi: int) -> bool:
        """Whether every position in [lo, hi) is held."""
        at = lo
        for start, rows in sorted(self._segments, key=lambda x: x[0]):
            if start <= at < start + rows.shape[0]:
                at = start + rows.shape[0]
        return at >= hi

    def get(self, lo: int, hi: int) -> mx.array:
        """Rows for positions [lo, hi), in order."""
        parts = []
        for start, rows in sorted(self._segments, key=lambda x: x[0]):
            a, b = max(lo, start), min(hi, start + rows.shape[0])
            if a < b:
                parts.append(rows[a - start : b - start])
        if not parts:
            raise ValueError(f"no hidden states for positions {lo} to {hi}")
        return parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=0)
