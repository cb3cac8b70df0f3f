"""The disk tier of an engine: its models' caches restored from, and stored to, block files.

`attach` binds an engine's cached models (the target, and a draft model) to a store;
`generate` is `Engine.generate` with the deepest cached prefix restored first and the disk's
figures in the Done's stats. The engine knows nothing of it: it prefills in block-sized chunks
and reports boundaries (`CachedModel.boundaries`), and takes restored caches like any saved
state. serve's RAM tier (serve/prompt_cache.py) sits above: it chooses the state in memory
first, and the disk adds only what memory lacks.
"""

from __future__ import annotations

import atexit
import logging
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from macspec.engine.caches import blocks
from macspec.engine.caches.cached import CachedModel, SavedCache
from macspec.engine.core.config import GenerationConfig
from macspec.engine.core.events import Done, Event
from macspec.engine.core.stats import Stats
from macspec.engine.drafters.protocol import Drafter
from macspec.engine.generate.loop import Engine
from macspec.models.catalog import ResolvedModels
from macspec.prefix.binding import ModelChain, Restored, Tally, Watch
from macspec.prefix.keys import root_key, settings_text
from macspec.prefix.settings import DEFAULT_DISK, DiskCacheSettings, Identity, folder_identities
from macspec.prefix.store import DiskStore
from macspec.prefix.writer import Writer

log = logging.getLogger("macspec.prefix")

TARGET, DRAFT = "target model", "draft model"
"""The names of the caches the tier stores (CachedModel.name)."""


def draft_state(drafter: Drafter | None) -> CachedModel | None:
    """The draft model's cache of a drafter (a model drafter, a hybrid's, --draft auto's)."""
    caches = drafter.caches() if drafter is not None else []
    return caches[0] if caches else None


@dataclass
class RowStart:
    """What the disk tier did for a request joining a batch."""

    restored: dict[str, Restored]
    """By model name: where its prefill starts."""
    tally: Tally


class DiskTier:
    """An engine's model caches bound to one store: the target's, and the draft model's."""

    def __init__(self, engine, store: DiskStore, writer: Writer, chains: dict[str, ModelChain]):
        self.engine = weakref.proxy(engine)
        self.store, self.writer, self.chains = store, writer, chains
        self.tally = Tally()
        """The latest request's figures (an Engine's; a batch's rows have their own)."""
        self.watches: dict[str, tuple[CachedModel, Watch]] = {}
        if hasattr(engine, "cached_models"):  # one sequence: its caches live as long as it
            for cached in engine.cached_models():
                if cached.name in chains:
                    self.watches[cached.name] = (cached, chains[cached.name].watch(cached))
        self.rows: dict[int, tuple[object, RowStart]] = {}
        """A batch's rows by id: (the row, its RowStart)."""

    # -- one sequence (Engine) -----------------------------------------------------------------
    def prepare(self, prompt: Sequence[int]) -> Tally:
        """Before a generation: restore the deepest cached prefix of `prompt` in every model
        whose cache holds less of it."""
        self.tally = Tally()
        for name, (cached, watch) in self.watches.items():
            # The target's restored ids are the prompt's cached ones; the draft's only save time.
            loads = self.tally if name == TARGET else Tally()
            restored = self.chains[name].restore(cached, prompt, loads)
            watch.begin(restored, self.tally)
            if restored.hidden is not None:
                cached.give_hidden(0, restored.hidden)
        return self.tally

    def fill(self, stats: Stats, tally: Tally | None = None) -> None:
        tally = tally if tally is not None else self.tally
        stats.disk_tokens = tally.loaded_tokens
        stats.disk_written_bytes = tally.written_bytes
        stats.disk_written_tokens = tally.written_tokens

    # -- a batch (BatchEngine) -----------------------------------------------------------------
    def start_row(
        self, prompt: Sequence[int], start: list[SavedCache] | None
    ) -> tuple[list[SavedCache] | None, RowStart]:
        """Before a request joins a batch: the state it starts from, `start` (from memory) or
        a deeper one restored from disk."""
        engine, started = self.engine, RowStart({}, Tally())
        target = CachedModel(engine.model, TARGET, options=engine.cache_options)
        if start:
            target.load(start[0])
        started.restored[TARGET] = self.chains[TARGET].restore(target, prompt, started.tally)
        if not started.tally.loaded_tokens:
            started.restored[TARGET].hidden = None
            return start, started
        saved = [target.save()]
        template = draft_state(engine.drafter)
        if DRAFT in self.chains and template is not None:
            draft = CachedModel(template.model, DRAFT, options=template.options)
            if start and len(start) > 1:
                draft.load(start[1])
            started.restored[DRAFT] = self.chains[DRAFT].restore(draft, prompt, Tally())
            saved.append(draft.save())
        return saved, started

    def watch_row(self, row, started: RowStart) -> None:
        """After a request joined (its caches made): store what its prefill computes."""
        for key, (other, _) in list(self.rows.items()):  # rows failed or cancelled meanwhile
            if other.done is not None:
                del self.rows[key]
        self.rows[id(row)] = (row, started)
        caches = {TARGET: row.alone, DRAFT: draft_state(row.drafter)}
        for name, cached in caches.items():
            if cached is None or name not in self.chains:
                continue
            restored = started.restored.get(name)
            if restored is None:  # not restored: its prefill starts where its cache ends
                last = (len(row.prompt) - 1) // self.chains[name].block * self.chains[name].block
                restored = Restored(len(cached), last)
            self.chains[name].watch(cached).begin(restored, started.tally)
            if restored.hidden is not None:
                cached.give_hidden(0, restored.hidden)
                restored.hidden = None

    def finish_row(self, row, stats: Stats) -> None:
        _, started = self.rows.pop(id(row), (None, None))
        if started is not None:
            self.fill(stats, started.tally)

    # -- writing -------------------------------------------------------------------------------
    def flush(self) -> None:
        """Queue what is held in memory (the latest recurrent states) for writing."""
        for chain in self.chains.values():
            chain.flush()

    def drain(self, timeout: float | None = 120.0) -> bool:
        """Write everything held and queued; wait until it is on disk."""
        self.flush()
        return self.writer.drain(timeout)


_tiers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def attach(
    engine,
    identities: dict[str, Identity],
    settings: DiskCacheSettings = DEFAULT_DISK,
) -> DiskTier | None:
    """Bind an engine's model caches to the disk tier (None when it is off: nothing is written
    then). `engine`: an Engine or a BatchEngine; `identities`: by CachedModel name ('target
    model', 'draft model')."""
    if not settings.enabled:
        return None
    store, writer = _writer(settings)
    models = {}  # name -> (module, cache options)
    if hasattr(engine, "cached_models"):
        models = {m.name: (m.model, m.options) for m in engine.cached_models()}
    else:
        models[TARGET] = (engine.model, engine.cache_options)
        template = draft_state(engine.drafter)
        if template is not None:
            models[DRAFT] = (template.model, template.options)
    chains = {}
    for name, (module, options) in models.items():
        identity = identities.get(name)
        if identity is None:
            continue
        fresh = options.make(module)
        kind = blocks.unsupported(fresh)
        if kind is not None:
            log.info("prompt cache: %s is not cached on disk (its %s)", identity.name, kind)
            continue
        root = root_key(identity.fingerprint, settings_text(settings.block, options))
        store.register(identity.fingerprint, {"name": identity.name, "folder": identity.folder})
        chains[name] = ModelChain(
            fresh, store, writer, identity.fingerprint, root, settings.block,
            settings.state_every, settings.dense_states, counts=name == TARGET,
        )  # fmt: skip
    if TARGET not in chains:
        return None
    tier = DiskTier(engine, store, writer, chains)
    _tiers[engine] = tier
    weakref.finalize(engine, tier.flush)  # an engine let go (a chat switching pairs)
    return tier


_writers: dict[tuple[Path, int], tuple[DiskStore, Writer]] = {}


def _writer(settings: DiskCacheSettings) -> tuple[DiskStore, Writer]:
    """One store and one writing thread per cache folder and bound in a process (a chat that
    switches pairs binds new engines to the same folder); what is queued is written at exit."""
    key = (settings.root, settings.max_bytes)
    if not _writers:
        atexit.register(_at_exit)
    if key not in _writers:
        store = DiskStore(settings.root, settings.max_bytes)
        _writers[key] = (store, Writer(store))
    return _writers[key]


def _at_exit() -> None:
    """Write what the tiers hold and what is queued before the process ends."""
    for tier in list(_tiers.values()):
        tier.flush()
    for _, writer in _writers.values():
        writer.drain()


def tier_of(engine: Engine) -> DiskTier | None:
    """The disk tier attached to an engine, if any."""
    return _tiers.get(engine)


def generate(
    engine: Engine,
    prompt: Sequence[int],
    config: GenerationConfig,
    cancelled: Callable[[], bool] | None = None,
) -> Iterator[Event]:
    """`engine.generate`, from the deepest prefix of the prompt cached in memory or on disk;
    the Done's stats say what the disk gave and took (`disk_tokens`, `disk_written_bytes`,
    `disk_written_tokens`)."""
    tier = tier_of(engine)
    if tier is not None:
        tier.prepare(prompt)
    events = engine.generate(prompt, config, cancelled)
    try:
        for event in events:
            if tier is not None and isinstance(event, Done):
                tier.fill(event.stats)
            yield event
    finally:
        events.close()


def attach_pair(engine, resolved: ResolvedModels, settings: DiskCacheSettings) -> DiskTier | None:
    """`attach` for an engine loaded from model folders (`ResolvedModels`); nothing when the
    disk tier is off."""
    if not settings.enabled:
        return None
    if hasattr(engine, "cached_models"):
        has_draft = any(m.name == DRAFT for m in engine.cached_models())
    else:  # a BatchEngine: its rows' drafters are of the kind of `engine.drafter`
        has_draft = draft_state(engine.drafter) is not None
    draft = resolved.draft if has_draft else None
    identities = folder_identities(
        resolved.target, resolved.target_name, draft, resolved.draft_name
    )
    return attach(engine, identities, settings)
