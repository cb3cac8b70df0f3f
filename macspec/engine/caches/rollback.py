"""How each layer cache type gives back its newest ids: the rollback protocol, and one
implementation per cache type mlx-lm makes.

Attention caches trim exactly at any length. A sliding window (`RotatingKVCache`) trims while
it has not wrapped, and right after a pass over several ids even when it has. Recurrent state
(`ArraysCache`: Gated DeltaNet, Mamba, short convolutions) cannot forget a token: `CachedModel`
checkpoints it instead.
"""

from __future__ import annotations

from typing import Any, Protocol

from mlx_lm.models.cache import (
    ArraysCache,
    ConcatenateKVCache,
    KVCache,
    QuantizedKVCache,
    RotatingKVCache,
)


class LayerRollback(Protocol):
    """Rollback for one kind of layer cache."""

    always_exact: bool
    """Its trim is exact at any length: the layer never needs a checkpoint."""

    def length(self, layer_cache: Any) -> int | None:
        """Ids the layer holds, where it says (attention caches); None for recurrent state."""

    def trims_exactly(self, layer_cache: Any, n: int) -> bool:
        """Whether the newest `n` ids can be taken out of this layer exactly."""

    def trim(self, layer_cache: Any, n: int) -> None:
        """Take the newest `n` ids out of the layer (`trims_exactly` said it can)."""


class AttentionRollback:
    """`KVCache`, `QuantizedKVCache`, `ConcatenateKVCache`: a trim is a cut of the rows."""

    always_exact = True

    def length(self, layer_cache: Any) -> int | None:
        return int(layer_cache.offset)

    def trims_exactly(self, layer_cache: Any, n: int) -> bool:
        return True

    def trim(self, layer_cache: Any, n: int) -> None:
        layer_cache.trim(n)


def _window_rows(layer_cache: RotatingKVCache) -> int:
    """Rows of a sliding-window cache that hold ids (its buffer can be larger than that)."""
    return min(layer_cache.offset, layer_cache.keys.shape[2])


class WindowRollback:
    """`RotatingKVCache`: exact until the window wraps; after that, only the ids of the last
    pass beyond the window's worth of older rows it kept."""

    always_exact = False

    def length(self, layer_cache: Any) -> int | None:
        return int(layer_cache.offset)

    def trims_exactly(self, layer_cache: Any, n: int) -> bool:
        """A wrapped sliding window can, right after a pass over several ids: that pass kept
        the window's worth of older rows besides its own, so dropping all but one of its own
        still leaves every row the next ids attend to."""
        if n <= 0 or layer_cache.is_trimmable():
            return True
        if layer_cache.keys is None:
            return False
        # Full windows keep at least max_size rows: mlx-lm's one-id step assumes it.
        left = _window_rows(layer_cache) - n
        return left >= min(layer_cache.offset - n, layer_cache.max_size)

    def trim(self, layer_cache: Any, n: int) -> None:
        if layer_cache.is_trimmable():
            layer_cache.trim(n)
            return
        # A wrapped window: put the rows in time order (mlx-lm's own helper), then cut the end.
        keys = layer_cache._temporal_order(layer_cache.keys)
        values = layer_cache._temporal_order(layer_cache.values)
        rows = _window_rows(layer_cache) - n
        layer_cache.keys, layer_cache.values = keys[..., :rows, :], values[..., :rows, :]
        layer_cache.offset -= n
        layer_cache._idx = rows


class RecurrentRollback:
    """`ArraysCache` (Gated DeltaNet, Mamba, short convolutions): state that cannot forget a
    token, and does not say how many it has seen; only a checkpoint rolls it back."""

    always_exact = False

    def length(self, layer_cache: Any) -> int | None:
        return None

    def trims_exactly(self, layer_cache: Any, n: int) -> bool:
        return n <= 0

    def trim(self, layer_cache: Any, n: int) -> None:
        raise ValueError("recurrent state cannot be trimmed; restore a checkpoint")


class OtherRollback:
    """Any other cache type mlx-lm may add: it trims where it says it can (`is_trimmable`),
    and its length is its `offset` where it keeps one."""

    always_exact = False

    def length(self, layer_cache: Any) -> int | None:
        offset = getattr(layer_cache, "offset", None)  # a type this module does not know
        return int(offset) if isinstance(offset, int) else None

    def trims_exactly(self, layer_cache: Any, n: int) -> bool:
        return n <= 0 or layer_cache.is_trimmable()

    def trim(self, layer_cache: Any, n: int) -> None:
        layer_cache.trim(n)


ATTENTION, WINDOW, RECURRENT, OTHER = (
    AttentionRollback(),
    WindowRollback(),
    RecurrentRollback(),
    OtherRollback(),
)


def rollback_of(layer_cache: Any) -> LayerRollback:
    """The rollback for this layer cache's type."""
    if isinstance(layer_cache, (KVCache, QuantizedKVCache, ConcatenateKVCache)):
        return ATTENTION
    if isinstance(layer_cache, RotatingKVCache):
        return WINDOW
    if isinstance(layer_cache, ArraysCache):
        return RECURRENT
    return OTHER
