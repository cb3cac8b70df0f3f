"""One model's blocks on disk: restore the deepest cached boundary of a prompt into a cache,
and store each block as a watched cache's prefill completes it.

Prefill runs in block-sized chunks that end at multiples of the block size
(`CachedModel.boundaries`), so a cold run and one restored at a boundary compute every later
chunk alike (`engine/caches/blocks.py`). At each boundary the block's attention rows are written,
and recurrent state, which is large (a few hundred KB to ~150 MB per boundary on real hybrids),
only at some: every `state_every`-th boundary, the boundary where a prompt leaves a chain
already on disk (where the next conversation sharing that prefix resumes), and the last
boundary of each prompt (where the next turn resumes), this last one held in memory until
another conversation comes or the process ends. Those are checkpoints (`state` files). With
`dense_states` (the default) every other boundary's state is written too, as a `state-thin`
file the store evicts first (store.py), and a held state the same conversation goes on past is
written as one: a prefix shared with an earlier prompt is then restored to within one block
while the folder has room, and to within `state_every` blocks once its thin states are gone.
Without it a held state the conversation goes past is dropped: a long agent session writes
its state once, not at every turn.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import mlx.core as mx

from macspec.engine.caches import blocks
from macspec.engine.caches.blocks import Boundaries
from macspec.engine.caches.cached import CachedModel, SavedCache
from macspec.engine.core.taps import Hidden, HiddenRows
from macspec.prefix.keys import Chain
from macspec.prefix.store import DiskStore
from macspec.prefix.writer import BlockWrite, Writer

RETRIES = 3
"""Restores tried again after a block proved damaged (it is deleted, so the next is shallower)."""
HELD_STATES = 4
"""Conversations whose last recurrent state is held in memory rather than written at once."""
STATE_KINDS = ("state", "state-thin")
"""A boundary's recurrent state: a checkpoint's, or one between checkpoints (evicted first)."""


@dataclass
class Tally:
    """What the disk tier did for one request."""

    loaded_tokens: int = 0
    """Prompt ids of the target loaded from disk (not prefilled, not in memory already)."""
    written_bytes: int = 0
    """Bytes of new block files (a prefix already cached writes nothing)."""
    written_tokens: int = 0
    """Prompt ids this request prefilled into the target's new blocks (each block once)."""


@dataclass
class Restored:
    """What a restore did, for the watch on the cache's prefill and its drafter."""

    first: int
    """The first id left to prefill (the cache holds those before it)."""
    last: int
    """The deepest boundary the prompt's prefill reaches."""
    state_at: set[int] = field(default_factory=set)
    """Boundaries whose recurrent state this prefill stores besides the usual ones."""
    hidden: Hidden | None = None
    """Hidden states restored for a drafter that reads the model (positions 0 on)."""


def hidden_kinds(cached: CachedModel) -> dict[str, object]:
    """What a drafter reading this model needs besides its cache: file kind -> Hidden field."""
    spec = cached.hidden_spec
    if spec is None:
        return {}
    kinds: dict[str, object] = {"hidden-final": "final"} if spec.final else {}
    kinds.update({f"hidden-L{layer}": layer for layer in spec.layers})
    return kinds


class ModelChain:
    """One model (its fingerprint and cache settings) and its blocks on disk."""

    def __init__(
        self,
        template: list,
        store: DiskStore,
        writer: Writer,
        fingerprint: str,
        root: str,
        block: int,
        state_every: int,
        dense: bool = True,
        counts: bool = False,
    ):
        self.template = template
        """A fresh cache of the model (as its CacheOptions make it): what a restore fills."""
        self.store, self.writer = store, writer
        self.fingerprint, self.block, self.state_every = fingerprint, block, state_every
        self.dense = dense
        """A state at every boundary: thin ones between the checkpoints."""
        self.counts = counts
        """Its new blocks count as the prompt's written ids (the target's chain)."""
        self.chain = Chain(root, block)
        self.rows = blocks.has_rows(template)
        self.state = blocks.has_state(template)
        self.held: OrderedDict[str, tuple[int, BlockWrite, Tally]] = OrderedDict()
        """Last recurrent states held in memory, by block key: (boundary, write, its tally)."""

    def path(self, key: str, kind: str) -> Path:
        return self.store.path(self.fingerprint, key, kind)

    def watch(self, cached: CachedModel) -> Watch:
        """Store the blocks `cached` prefills from now on."""
        watch = Watch(self, cached)
        cached.boundaries = Boundaries(self.block, watch.reached)
        if watch.kinds:
            cached.listen_hidden(watch.heard)
        return watch

    # -- restoring -----------------------------------------------------------------------------
    def restore(self, cached: CachedModel, prompt: Sequence[int], tally: Tally) -> Restored:
        """Restore the deepest boundary of `prompt` on disk into `cached` when it holds more
        than `cached` would keep; the ids added go to `tally`."""
        block = self.block
        last = (len(prompt) - 1) // block * block  # the deepest boundary prefill reaches
        kept = len(prompt) - len(cached.reuse(prompt))  # trims what the engine would trim
        keys = self.chain.keys(prompt, last // block)
        self._settle_held(keys, last)
        kinds = hidden_kinds(cached)
        restored = Restored(kept, last)
        for _ in range(RETRIES):
            depth, branch = self._plan(keys, kept, kinds)
            if self.state and branch * block > kept:
                restored.state_at.add(branch * block)  # where it leaves a cached chain
            if depth * block <= kept:
                self._touch(keys, kept // block, kinds)
                break
            hidden = self._load(cached, prompt, keys, depth, kept, kinds)
            if hidden is not False:
                tally.loaded_tokens += depth * block - kept
                restored.first, restored.hidden = depth * block, hidden
                break
        return restored

    def _plan(self, keys: list[str], kept: int, kinds) -> tuple[int, int]:
        """(the deepest boundary, in blocks, that can be restored: every block it needs and its
        state on disk; the deepest boundary whose rows chain is on disk)."""
        block = self.block
        head = kept // block if self.rows else 0
        exists = functools.cache(lambda i, kind: self.path(keys[i], kind).is_file())
        states = functools.cache(lambda i: any(exists(i, kind) for kind in STATE_KINDS))
        chained = len(keys)
        if self.rows:
            chained = next((i for i in range(head, len(keys)) if not exists(i, "rows")), len(keys))
        for depth in range(chained, 0, -1):
            if depth * block <= kept:
                break
            if self.state and not states(depth - 1):
                continue
            needed = blocks.blocks_needed(self.template, depth * block, block, head * block)
            if not all(exists(i, "rows") for i in needed):
                continue
            if all(exists(i, kind) for kind in kinds for i in range(depth)):
                return depth, chained
        return 0, chained

    def _load(self, cached, prompt, keys, depth: int, kept: int, kinds) -> Hidden | None | bool:
        """Restore `depth` blocks into `cached`; False when a file went missing or proved
        damaged (it is dropped: plan again)."""
        block, length = self.block, depth * self.block
        head = kept // block if self.rows else 0
        needed = sorted(blocks.blocks_needed(self.template, length, block, head * block))
        wanted = [(i, "rows") for i in needed]
        state = self._state_kind(keys[depth - 1]) if self.state else None
        if self.state:
            if state is None:
                return False
            wanted.append((depth - 1, state))
        wanted += [(i, kind) for kind in kinds for i in range(depth)]
        loaded = self.store.load_many([(self.path(keys[i], k), keys[i], k) for i, k in wanted])
        if any(arrays is None for arrays in loaded):
            return False
        found = dict(zip(wanted, loaded))
        options = cached.options
        quantize = None
        if options.kv_bits is not None and length >= options.quantized_kv_start:
            quantize = (options.kv_group_size, options.kv_bits)
        cache = blocks.rebuild(
            self.template,
            length,
            block,
            lambda i: found[(i, "rows")],
            found.get((depth - 1, state)),
            quantize,
            head=cached.cache if head else None,
            head_length=head * block,
        )
        mx.eval([c.state for _, c in blocks.leaves(cache)])
        cached.load(SavedCache(tuple(prompt[:length]), cache, {}))
        self._touch(keys, depth, kinds)
        if not kinds:
            return None
        hidden = Hidden()
        for kind, part in kinds.items():
            rows = mx.concatenate([found[(i, kind)]["x"] for i in range(depth)], axis=0)
            if part == "final":
                hidden.final = rows
            else:
                hidden.layers[part] = rows
        return hidden

    def _touch(self, keys: list[str], depth: int, kinds) -> None:
        """Mark a chain used: its blocks, and the state at its end."""
        for i in range(depth):
            for kind in (["rows"] if self.rows else []) + list(kinds):
                self.store.touch(self.path(keys[i], kind), i)
        if self.state and depth:
            kind = self._state_kind(keys[depth - 1])
            if kind is not None:
                self.store.touch(self.path(keys[depth - 1], kind), depth - 1)

    def _state_kind(self, key: str) -> str | None:
        """The kind of the state on disk at a block's end (a checkpoint's first), if any."""
        return next((k for k in STATE_KINDS if self.path(key, k).is_file()), None)

    # -- held states ---------------------------------------------------------------------------
    def hold(self, key: str, length: int, write: BlockWrite, tally: Tally) -> None:
        self.held.pop(key, None)
        self.held[key] = (length, write, tally)
        while len(self.held) > HELD_STATES:
            self._write_held(next(iter(self.held)))

    def _settle_held(self, keys: list[str], last: int) -> None:
        """A prompt that goes on past a held state will hold a deeper one: the held one is
        written as a thin state (`dense`), or dropped."""
        for key, (length, write, tally) in list(self.held.items()):
            index = length // self.block - 1
            if last > length and index < len(keys) and keys[index] == key:
                del self.held[key]
                if self.dense:
                    path = self.path(key, "state-thin")
                    meta = {**write.meta, "kind": "state-thin"}
                    self.submit(replace(write, path=path, meta=meta), tally)

    def _write_held(self, key: str) -> None:
        _, write, tally = self.held.pop(key)
        self.submit(write, tally)

    def flush(self) -> None:
        """Write every held state (the process ends, or an engine is let go)."""
        for key in list(self.held):
            self._write_held(key)

    def submit(self, write: BlockWrite, tally: Tally) -> None:
        self.writer.submit(write)
        tally.written_bytes += write.nbytes


class Watch:
    """A cache being prefilled for one request: the blocks its boundaries complete are stored."""

    def __init__(self, chain: ModelChain, cached: CachedModel):
        self.chain = chain
        self.kinds = hidden_kinds(cached)
        self.hidden = {kind: HiddenRows() for kind in self.kinds}
        self.first = 0
        """The first id this request prefills (hidden rows before it are not recorded)."""
        self.last = 0
        """The deepest boundary this request's prefill reaches (its state is held)."""
        self.state_at: set[int] = set()
        """Boundaries (besides every state_every-th) whose state is stored this request."""
        self.tally = Tally()
        self.counted: set[int] = set()
        """Blocks (by index) whose ids this request's tally counts as written."""

    def begin(self, restored: Restored, tally: Tally) -> None:
        """A request's prefill starts where `restored` says."""
        self.first, self.last, self.state_at = restored.first, restored.last, restored.state_at
        self.tally, self.counted = tally, set()
        self.hidden = {kind: HiddenRows() for kind in self.kinds}

    def reached(self, cached: CachedModel, length: int) -> None:
        """A prefill chunk ended at a boundary: write what is not on disk yet."""
        chain, block = self.chain, self.chain.block
        index = length // block - 1
        keys = chain.chain.keys(cached.tokens, index + 1)
        key = keys[index]
        meta = {"key": key, "parent": chain.chain.parent(keys, index), "end": str(length)}
        if chain.rows:
            rows = functools.partial(blocks.rows, cached.cache, length - block, length)
            self._write(key, "rows", index, meta, rows)
        due = (index + 1) % chain.state_every == 0 or length in self.state_at
        state = functools.partial(blocks.state, cached.cache)
        if chain.state and (due or length == self.last):
            self._write(key, "state", index, meta, state, hold=not due)
        elif chain.state and chain.dense and not chain.path(key, "state").is_file():
            self._write(key, "state-thin", index, meta, state)
        for kind, recorded in self.hidden.items():
            if length - block >= self.first and recorded.has(length - block, length):
                rows = recorded.get(length - block, length)
                self._write(key, kind, index, meta, lambda rows=rows: {"x": mx.contiguous(rows)})
                recorded.forget_before(length)

    def _write(self, key, kind: str, index: int, meta: dict, arrays, hold: bool = False) -> None:
        path = self.chain.path(key, kind)
        if path.is_file():
            return
        made = arrays()
        if made is None:  # a sliding window no longer holds the block's rows
            return
        mx.eval(made)
        nbytes = sum(a.nbytes for a in made.values())
        write = BlockWrite(path, made, {**meta, "kind": kind}, index, nbytes)
        if self.chain.counts and index not in self.counted:  # a block's ids once, any file
            self.counted.add(index)
            end = int(meta["end"])
            self.tally.written_tokens += end - max(end - self.chain.block, self.first)
        if hold:
            self.chain.hold(key, int(meta["end"]), write, self.tally)
        else:
            self.chain.submit(write, self.tally)

    def heard(self, start: int, hidden: Hidden) -> None:
        """A pass's hidden states: kept while they are this request's prefill rows."""
        if not self.first <= start < self.last:
            return
        for kind, part in self.kinds.items():
            rows = hidden.final if part == "final" else hidden.layers.get(part)
            if rows is not None:
                self.hidden[kind].add(start, rows)
