"""A model together with its cache and the token ids that cache holds, with rollback for every
cache type mlx-lm makes.

Knowing the ids is what makes rollback and reuse exact: rolling back keeps a prefix of them,
and a new prompt reuses the longest common prefix instead of prefilling from scratch.

Attention caches (`KVCache`, `QuantizedKVCache`) roll back by trimming. Recurrent layers
(`ArraysCache`: Gated DeltaNet, Mamba, short convolutions) and sliding windows that have wrapped
(`RotatingKVCache`) cannot forget a token, so the model is *checkpointed* before a pass that may
be rolled back: a copy of each such layer's state, made of new handles to the same arrays (no data
is copied). Rolling back to a length the layers cannot trim to restores the latest checkpoint at or
before it; the ids after the checkpoint are then fed again, as part of the next pass.
Gated DeltaNet layers (Qwen3.5/3.6) need no re-feed: the pass after a checkpoint is recorded,
and their state at any point of it is recomputed from the record (`recurrent.py`).

MLX's in-place slice assignment (`cache.keys[...] = k`, which `RotatingKVCache` uses for one-token
steps) rewrites the array object that every Python reference shares, so a checkpoint never keeps
the live array objects: `mx.array(x)` is a separate handle to x's data as it is now, and MLX copies
the buffer (once) before writing into it while a checkpoint still holds it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import (
    ArraysCache,
)

from macspec.engine.caches import recurrent
from macspec.engine.caches.blocks import Boundaries
from macspec.engine.caches.rollback import rollback_of
from macspec.engine.core.config import DEFAULT_CACHE, CacheOptions  # noqa: F401  (re-exported)
from macspec.engine.core.taps import Hidden, HiddenSpec, Taps
from macspec.errors import MacspecError

PREFILL_CHUNK = 2048
"""Prompt ids per prefill pass, as mlx-lm's generate: bounded memory, full GPU batches."""


def snapshot(value: Any) -> Any:
    """A copy of a cache's state that later updates of the live cache cannot reach.

    Arrays become new handles to their current data (no copy now); lists, tuples, dicts and
    nested cache objects are rebuilt around them; everything else (ints, None) is immutable.
    """
    if isinstance(value, mx.array):
        return mx.array(value)
    if isinstance(value, list):
        return [snapshot(v) for v in value]
    if isinstance(value, tuple):
        return tuple(snapshot(v) for v in value)
    if isinstance(value, dict):
        return {k: snapshot(v) for k, v in value.items()}
    if value is None or isinstance(value, (int, float, str, bool)):
        return value
    if hasattr(value, "update_and_fetch") or hasattr(value, "state"):  # a nested cache (CacheList)
        clone = object.__new__(type(value))
        clone.__dict__.update(snapshot(vars(value)))
        return clone
    raise TypeError(f"cannot checkpoint a {type(value).__name__}")


@dataclass
class Checkpoint:
    """The state of the layers that cannot trim, after the first `length` ids."""

    length: int
    """Ids the cache had seen when the checkpoint was taken."""
    layers: dict[int, dict[str, Any]]
    """Layer index -> a snapshot of that layer cache's attributes."""


@dataclass(frozen=True)
class SavedCache:
    """A CachedModel's whole state at one moment, for `CachedModel.load` to return to later
    (a server keeping several conversations' caches). Holds new handles, not copies: MLX copies
    a buffer only when the live cache then writes into it."""

    tokens: tuple[int, ...]
    """The ids the cache had seen."""
    cache: list[Any]
    """A snapshot of every layer's cache."""
    checkpoints: dict[str, Checkpoint]
    """The checkpoints it held (they are never changed in place, so they are shared)."""


class CachedModel:
    """A language model, its cache, and `tokens`: exactly the ids the cache has seen."""

    def __init__(
        self,
        model: nn.Module,
        name: str = "model",
        cache: list[Any] | None = None,
        options: CacheOptions = DEFAULT_CACHE,
    ):
        self.model = model
        self.name = name
        self.options = options
        self.cache = cache if cache is not None else options.make(model)
        self._tokens: list[int] = []
        # Ids fed as unevaluated arrays (a draft feeding its own guesses), resolved on demand
        # so drafting never waits for a sync just to keep this bookkeeping.
        self._lazy: list[mx.array] = []
        self._checkpoints: dict[str, Checkpoint] = {}
        self.restores = 0
        """Rollbacks that restored a checkpoint (the ids after it are fed again)."""
        self._recordable = recurrent.install(model) > 0
        self._record_next = False
        self._pass: tuple[int, int, recurrent.PassRecord] | None = None
        """(ids before, ids fed, record) of the last pass, when it was recorded."""
        self._taps: Taps | None = None
        self._hidden_sink: Callable[[int, Hidden], None] | None = None
        self._hidden_listeners: list[Callable[[int, Hidden], None]] = []
        self.boundaries: Boundaries | None = None
        """Set by a prompt cache: prefill chunks end at its block boundaries."""

    def tap(self, spec: HiddenSpec, sink: Callable[[int, Hidden], None]) -> None:
        """Hand every pass's hidden states (as `spec` asks) to `sink(first position, hidden)`."""
        self._taps = Taps(self.model, spec)
        self._hidden_sink = sink

    @contextmanager
    def holding_hidden(self) -> Iterator[list[tuple[int, Hidden]]]:
        """Passes inside the block keep their hidden states in the list it yields instead of
        handing them to the drafter (a tree pass hands over the kept path's rows only, with
        `hand_hidden`, once the verdict is known)."""
        sink, held = self._hidden_sink, []
        if sink is not None:
            self._hidden_sink = lambda start, hidden: held.append((start, hidden))
        try:
            yield held
        finally:
            self._hidden_sink = sink

    def hand_hidden(self, start: int, hidden: Hidden) -> None:
        """Hand the drafter hidden states for positions start, start + 1, ..."""
        if self._hidden_sink is not None:
            self._hidden_sink(start, hidden)

    @property
    def hidden_spec(self) -> HiddenSpec | None:
        """What each pass hands to the drafter reading it; None when nothing is tapped."""
        return self._taps.spec if self._taps is not None else None

    def listen_hidden(self, sink: Callable[[int, Hidden], None]) -> None:
        """Hand every pass's hidden states to `sink` too (a prompt cache stores them)."""
        self._hidden_listeners.append(sink)

    def give_hidden(self, start: int, hidden: Hidden) -> None:
        """Hand the drafter hidden states a pass did not compute (a prompt cache restored
        them), as a pass over positions start, start + 1, ... would."""
        if self._hidden_sink is not None:
            self._hidden_sink(start, hidden)

    @property
    def tokens(self) -> list[int]:
        if self._lazy:
            for array in self._lazy:
                self._tokens.extend(array.tolist())
            self._lazy = []
        return self._tokens

    @property
    def needs_checkpoints(self) -> bool:
        """Whether some layer may be unable to trim (recurrent state, a sliding window)."""
        return not all(rollback_of(c).always_exact for c in self.cache)

    def require_rollback(self) -> None:
        """Refuse, at load, a cache this class can neither trim nor checkpoint."""
        for layer_cache in self.cache:
            if rollback_of(layer_cache).always_exact:
                continue
            try:
                snapshot(vars(layer_cache))
            except TypeError as exc:
                raise MacspecError(
                    f"{self.name}: its cache ({type(layer_cache).__name__}) cannot be rolled "
                    f"back ({exc}), so it cannot be used for speculative decoding "
                    "(try --no-draft)"
                ) from None

    def __len__(self) -> int:
        return len(self._tokens) + sum(a.size for a in self._lazy)

    def forward(self, ids: Sequence[int] | mx.array) -> mx.array:
        """Feed ids through the model, extending the cache; returns logits (len(ids), V), lazily."""
        before = len(self)
        if isinstance(ids, mx.array):
            array = ids
            self._lazy.append(ids)
        else:
            array = mx.array(list(ids), mx.uint32)
            self.tokens.extend(ids)
        self._pass, record, hidden = None, None, None
        with ExitStack() as stack:
            if self._record_next:  # the verify pass after a checkpoint (see recurrent.py)
                self._record_next = False
                record = stack.enter_context(recurrent.recording(recurrent.PassRecord()))
            if self._taps is not None:  # a drafter reads this pass's hidden states
                hidden = stack.enter_context(self._taps.record())
            logits = self.model(array[None], cache=self.cache)[0]
        self.options.quantize(self.cache)
        if record is not None:
            self._pass = (before, len(self) - before, record)
        if hidden is not None and self._hidden_sink is not None:
            self._hidden_sink(before, hidden)
            for listener in self._hidden_listeners:
                listener(before, hidden)
        return logits

    def prefill(self, ids: Sequence[int], step: int = PREFILL_CHUNK) -> None:
        """Feed ids in chunks of `step`, evaluating as it goes so memory stays bounded on long
        prompts; MLX's buffer cache is emptied after each chunk, as mlx-lm does. With
        `boundaries`, a chunk is a block (it ends at the next block boundary, then reported)."""
        done, blocks = 0, self.boundaries
        while done < len(ids):
            if blocks is not None:
                step = blocks.block - len(self) % blocks.block
            size = min(step, len(ids) - done)
            self.forward(ids[done : done + size])
            mx.eval([c.state for c in self.cache])
            mx.clear_cache()
            done += size
            if blocks is not None and len(self) % blocks.block == 0:
                blocks.reached(self, len(self))

    def replace_tail(self, start: int, ids: Sequence[int]) -> None:
        """The ids from `start` on are now `ids`: a tree pass kept one path of its nodes, its
        cache already compacted to them (bookkeeping only). The pass's record, made for ids in
        a row, no longer describes the cache."""
        tokens = self.tokens
        del tokens[start:]
        tokens.extend(ids)
        self._pass = None

    # -- rollback ------------------------------------------------------------------------------
    def checkpoint(self, slot: str = "cycle") -> None:
        """Remember the state after the ids fed so far, so a rollback can return here.

        One checkpoint per slot ('cycle' before a verify pass, 'prompt' after a prefill, kept
        for the next chat turn); a no-op for models whose layers all trim.
        """
        if not self.needs_checkpoints:
            return
        layers = {
            i: snapshot(vars(c))
            for i, c in enumerate(self.cache)
            if not rollback_of(c).always_exact
        }
        self._checkpoints[slot] = Checkpoint(len(self), layers)
        # Record the pass that follows a cycle's checkpoint: Gated DeltaNet layers then roll
        # back to any point of it without a restore (see recurrent.py).
        self._record_next = self._recordable and slot == "cycle"

    def can_trim_to(self, length: int) -> bool:
        """Whether every layer holding more than `length` ids can trim them away exactly."""
        for layer_cache in self.cache:
            held = rollback_of(layer_cache).length(layer_cache)
            if held is None:
                held = len(self)
            if held > length and not rollback_of(layer_cache).trims_exactly(
                layer_cache, held - length
            ):
                return False
        return True

    def trim_to(self, length: int) -> int:
        """Hold at most the first `length` ids; returns how many the cache holds now.

        Trims where every layer can; otherwise restores the latest checkpoint at or before
        `length` (fewer ids: the caller feeds the rest again), and with none, starts over empty.
        Works per layer from each layer's own length, so a forward pass interrupted halfway
        (Ctrl-C between layers) still leaves every layer at the same, consistent length.
        """
        length = max(0, min(length, len(self)))
        lengths = [rollback_of(c).length(c) for c in self.cache]
        longer = any(n is not None and n > length for n in lengths)
        if length == len(self) and not longer:
            return length
        if self.can_trim_to(length):
            for layer_cache, n in zip(self.cache, lengths):
                if n is not None and n > length:
                    rollback_of(layer_cache).trim(layer_cache, n - length)
        elif not self._rewind_recorded(length, lengths):
            length = self._restore(length)
        self._pass = None
        del self.tokens[length:]
        self._checkpoints = {k: c for k, c in self._checkpoints.items() if c.length <= length}
        return length

    def _rewind_recorded(self, length: int, lengths: list[int | None]) -> bool:
        """Roll back into the last recorded pass exactly: Gated DeltaNet states recomputed from
        the record, every other layer trimmed. False when the record cannot serve."""
        if self._pass is None:
            return False
        before, fed, record = self._pass
        recurrent_layers = [c for c in self.cache if isinstance(c, ArraysCache)]
        others_trim = all(
            isinstance(c, ArraysCache)
            or n is None
            or n <= length
            or rollback_of(c).trims_exactly(c, n - length)
            for c, n in zip(self.cache, lengths)
        )
        if not (before <= length <= before + fed and others_trim):
            return False
        if not recurrent.usable(record, len(recurrent_layers), fed):
            return False
        for index, layer_cache in enumerate(recurrent_layers):
            layer_cache[0], layer_cache[1] = recurrent.states_after(record, index, length - before)
        for layer_cache, n in zip(self.cache, lengths):
            if not isinstance(layer_cache, ArraysCache) and n is not None and n > length:
                rollback_of(layer_cache).trim(layer_cache, n - length)
        return True

    def _restore(self, length: int) -> int:
        usable = [c for c in self._checkpoints.values() if c.length <= length]
        if not usable:  # nothing to return to: start this model's cache over
            self.cache = self.options.make(self.model)
            self._tokens, self._lazy, self._checkpoints = [], [], {}
            return 0
        checkpoint = max(usable, key=lambda c: c.length)
        for i, layer_cache in enumerate(self.cache):
            if i in checkpoint.layers:
                # A fresh snapshot: the checkpoint stays valid for another rollback.
                layer_cache.__dict__.clear()
                layer_cache.__dict__.update(snapshot(checkpoint.layers[i]))
            else:
                held = rollback_of(layer_cache).length(layer_cache)
                if held is not None and held > checkpoint.length:
                    rollback_of(layer_cache).trim(layer_cache, held - checkpoint.length)
        self.restores += 1
        return checkpoint.length

    def settle(self, keep: int, last_delivered: int | None) -> None:
        """After a generation: hold the `keep` ids before the last delivered one, or those and
        the last delivered one too, where it was fed already and trimming it would cost a
        restore (a recurrent model's pipelined last step). Never undelivered ids."""
        if (
            last_delivered is not None
            and len(self) == keep + 1
            and not self.can_trim_to(keep)
            and self.tokens[keep] == last_delivered
        ):
            return
        self.trim_to(keep)

    def reuse(self, prompt: Sequence[int]) -> list[int]:
        """Keep the cached prefix shared with `prompt`; return the ids still to be fed.

        At least one id is always left to feed: its logits are what predicts the next token.
        """
        shared = 0
        limit = min(len(self), len(prompt) - 1)
        tokens = self.tokens
        while shared < limit and tokens[shared] == prompt[shared]:
            shared += 1
        held = self.trim_to(shared)
        return list(prompt[held:])

    # -- saving a whole state ------------------------------------------------------------------
    def save(self) -> SavedCache:
        """The state now, to `load` later; TypeError for a cache that cannot be snapshot."""
        return SavedCache(tuple(self.tokens), snapshot(self.cache), dict(self._checkpoints))

    def load(self, saved: SavedCache) -> None:
        """Return to a saved state (which stays valid: it can be loaded again)."""
        self.cache = snapshot(saved.cache)
        self._tokens, self._lazy = list(saved.tokens), []
        self._checkpoints = dict(saved.checkpoints)
        self._pass, self._record_next = None, False
