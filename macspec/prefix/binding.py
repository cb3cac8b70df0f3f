"""One model's cache bound to the disk tier: restore the deepest cached boundary of a prompt,
and store each block as prefill completes it.

Prefill runs in block-sized chunks that end at multiples of the block size
(`CachedModel.boundaries`), so a cold run and one restored at a boundary compute every later
chunk alike (`engine/blocks.py`). At each boundary the block's attention rows are written, and
recurrent state, which is large (a few hundred KB to ~150 MB per boundary on real hybrids),
only at some: every `state_every`-th boundary, the last boundary of each prompt (where the next
turn of the conversation resumes), and the boundary where the prompt leaves a chain already
on disk (where the next conversation sharing that prefix resumes).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx

from macspec.engine import blocks
from macspec.engine.cached import Boundaries, CachedModel, SavedCache
from macspec.engine.taps import Hidden, HiddenRows
from macspec.prefix.keys import Chain
from macspec.prefix.store import DiskStore
from macspec.prefix.writer import BlockWrite, Writer

RETRIES = 3
"""Restores tried again after a block proved damaged (it is deleted, so the next is shallower)."""


@dataclass
class Tally:
    """What the disk tier did for one request."""

    loaded_tokens: int = 0
    """Prompt ids of the target loaded from disk (not prefilled, not in memory already)."""
    written_bytes: int = 0
    """Bytes of new block files (a prefix already cached writes nothing)."""
    written_blocks: int = 0


class ModelBinding:
    """A CachedModel (the target, or the draft model) and its blocks on disk."""

    def __init__(
        self,
        model: CachedModel,
        store: DiskStore,
        writer: Writer,
        fingerprint: str,
        root: str,
        block: int,
        state_every: int,
        tally: Tally,
    ):
        self.model, self.store, self.writer = model, store, writer
        self.fingerprint, self.block, self.state_every = fingerprint, block, state_every
        self.tally = tally
        self.chain = Chain(root, block)
        self.template = model.options.make(model.model)
        self.rows = blocks.has_rows(self.template)
        self.state = blocks.has_state(self.template)
        spec = model.hidden_spec
        self.hidden_kinds: dict[str, object] = {}
        """What a drafter reading the target needs besides its cache: kind -> Hidden field."""
        if spec is not None:
            if spec.final:
                self.hidden_kinds["hidden-final"] = "final"
            for layer in spec.layers:
                self.hidden_kinds[f"hidden-L{layer}"] = layer
            model.listen_hidden(self._heard)
        self.hidden = {kind: HiddenRows() for kind in self.hidden_kinds}
        self.limit = 0
        """Prefill positions before this one are recorded for hidden-state blocks."""
        self.first = 0
        """The first id this request prefills (hidden rows before it were not recorded)."""
        self.state_at: set[int] = set()
        """Boundaries (besides every state_every-th) whose state is stored this request."""
        self.last = 0
        """The deepest boundary this request's prefill reaches."""
        self.pending: tuple[int, str, BlockWrite] | None = None
        """The state at the last request's deepest boundary (its length, key, write), held in
        memory: written when another conversation comes or the process ends, dropped when
        the same conversation goes on past it (SSD wear: one conversation writes its
        recurrent state once, not at every turn)."""
        model.boundaries = Boundaries(block, self.reached)

    def path(self, key: str, kind: str) -> Path:
        return self.store.path(self.fingerprint, key, kind)

    # -- restoring -----------------------------------------------------------------------------
    def prepare(self, prompt: Sequence[int]) -> int:
        """Restore the deepest boundary of `prompt` on disk when it holds more than the
        model's cache would keep; returns how many ids that added."""
        model, block = self.model, self.block
        last = (len(prompt) - 1) // block * block  # the deepest boundary prefill reaches
        kept = len(prompt) - len(model.reuse(prompt))  # trims what the engine would trim
        keys = self.chain.keys(prompt, last // block)
        self.first, self.limit, self.state_at, self.last = kept, last, set(), last
        self._settle_pending(keys, last)
        for kind in self.hidden_kinds:
            self.hidden[kind] = HiddenRows()
        for _ in range(RETRIES):
            depth, branch = self._plan(keys, kept)
            if self.state and branch * block > kept:
                self.state_at.add(branch * block)  # where this prompt leaves a cached chain
            if depth * block <= kept:
                self._touch(keys, kept // block, kept // block)
                return 0
            if self._restore(prompt, keys, depth, kept):
                return depth * block - kept
        return 0

    def _plan(self, keys: list[str], kept: int) -> tuple[int, int]:
        """(the deepest boundary, in blocks, that can be restored: every block it needs and its
        state on disk; the deepest boundary whose rows chain is on disk)."""
        block = self.block
        head = kept // block if self.rows else 0
        exists = functools.cache(lambda i, kind: self.path(keys[i], kind).is_file())
        chained = len(keys)
        if self.rows:
            chained = next((i for i in range(head, len(keys)) if not exists(i, "rows")), len(keys))
        for depth in range(chained, 0, -1):
            if depth * block <= kept:
                break
            if self.state and not exists(depth - 1, "state"):
                continue
            needed = blocks.blocks_needed(self.template, depth * block, block, head * block)
            if not all(exists(i, "rows") for i in needed):
                continue
            if all(exists(i, kind) for kind in self.hidden_kinds for i in range(depth)):
                return depth, chained
        return 0, chained

    def _restore(self, prompt: Sequence[int], keys: list[str], depth: int, kept: int) -> bool:
        model, block = self.model, self.block
        length = depth * block
        head = kept // block if self.rows else 0
        needed = sorted(blocks.blocks_needed(self.template, length, block, head * block))
        wanted = [(i, "rows") for i in needed]
        if self.state:
            wanted.append((depth - 1, "state"))
        wanted += [(i, kind) for kind in self.hidden_kinds for i in range(depth)]
        loaded = self.store.load_many([(self.path(keys[i], k), keys[i], k) for i, k in wanted])
        if any(arrays is None for arrays in loaded):
            return False  # a block went missing or was damaged (and dropped): plan again
        found = dict(zip(wanted, loaded))
        options = model.options
        quantize = None
        if options.kv_bits is not None and length >= options.quantized_kv_start:
            quantize = (options.kv_group_size, options.kv_bits)
        cache = blocks.rebuild(
            self.template,
            length,
            block,
            lambda i: found[(i, "rows")],
            found.get((depth - 1, "state")),
            quantize,
            head=model.cache if head else None,
            head_length=head * block,
        )
        mx.eval([c.state for _, c in blocks.leaves(cache)])
        model.load(SavedCache(tuple(prompt[:length]), cache, {}))
        self.first = length  # prefill resumes here
        if self.hidden_kinds:
            model.give_hidden(0, self._joined_hidden(found, depth))
        self._touch(keys, depth, depth)
        return True

    def _joined_hidden(self, found: dict, depth: int) -> Hidden:
        hidden = Hidden()
        for kind, field in self.hidden_kinds.items():
            rows = mx.concatenate([found[(i, kind)]["x"] for i in range(depth)], axis=0)
            if field == "final":
                hidden.final = rows
            else:
                hidden.layers[field] = rows
        return hidden

    def _touch(self, keys: list[str], depth: int, state_depth: int) -> None:
        """Mark a chain used: its blocks, and the state it was restored from."""
        kinds = (["rows"] if self.rows else []) + list(self.hidden_kinds)
        for i in range(depth):
            for kind in kinds:
                self.store.touch(self.path(keys[i], kind), i)
        if self.state and state_depth:
            self.store.touch(self.path(keys[state_depth - 1], "state"), state_depth - 1)

    # -- storing -------------------------------------------------------------------------------
    def reached(self, model: CachedModel, length: int) -> None:
        """A prefill chunk ended at a boundary: write what is not on disk yet."""
        block = self.block
        index = length // block - 1
        keys = self.chain.keys(model.tokens, index + 1)
        key = keys[index]
        meta = {"key": key, "parent": self.chain.parent(keys, index), "end": str(length)}
        if self.rows:
            rows = functools.partial(blocks.rows, model.cache, length - block, length)
            self._write(key, "rows", index, meta, rows)
        due = (index + 1) % self.state_every == 0 or length in self.state_at
        if self.state and (due or length == self.last):
            state = functools.partial(blocks.state, model.cache)
            self._write(key, "state", index, meta, state, hold=not due)
        for kind, recorded in self.hidden.items():
            if length - block >= self.first and recorded.has(length - block, length):
                rows = recorded.get(length - block, length)
                self._write(key, kind, index, meta, lambda rows=rows: {"x": mx.contiguous(rows)})
                recorded.forget_before(length)

    def _write(self, key, kind: str, index: int, meta: dict, arrays, hold: bool = False) -> None:
        path = self.path(key, kind)
        if path.is_file():
            return
        made = arrays()
        if made is None:  # a sliding window no longer holds the block's rows
            return
        mx.eval(made)
        nbytes = sum(a.nbytes for a in made.values())
        write = BlockWrite(path, made, {**meta, "kind": kind}, index, nbytes)
        if hold:
            self.flush()
            self.pending = (int(meta["end"]), key, write)
            return
        self.writer.submit(write)
        self.tally.written_bytes += nbytes
        self.tally.written_blocks += 1

    def _settle_pending(self, keys: list[str], last: int) -> None:
        """Before a request: drop the held state if this prompt goes on past it (it will hold
        a deeper one), keep it if the prompt stops there, else write it."""
        if self.pending is None:
            return
        length, key, _ = self.pending
        continues = length <= len(keys) * self.block and keys[length // self.block - 1] == key
        if continues and last > length:
            self.pending = None
        elif not continues:
            self.flush()

    def flush(self) -> None:
        """Write the held state now (another conversation came, or the process ends)."""
        if self.pending is not None:
            write = self.pending[2]
            self.pending = None
            self.writer.submit(write)
            self.tally.written_bytes += write.nbytes
            self.tally.written_blocks += 1

    def _heard(self, start: int, hidden: Hidden) -> None:
        """A target pass's hidden states: kept while they are prefill rows to store."""
        if not self.first <= start < self.limit:
            return
        for kind, field in self.hidden_kinds.items():
            rows = hidden.final if field == "final" else hidden.layers.get(field)
            if rows is not None:
                self.hidden[kind].add(start, rows)
