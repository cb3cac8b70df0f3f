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
from pathlib import Path

from macspec.engine import blocks
from macspec.engine.cached import CacheOptions
from macspec.engine.config import GenerationConfig
from macspec.engine.events import Done, Event
from macspec.engine.loop import Engine
from macspec.engine.stats import Stats
from macspec.models.catalog import ResolvedModels
from macspec.prefix.binding import ModelBinding, Tally
from macspec.prefix.keys import root_key, settings_text
from macspec.prefix.settings import DEFAULT_DISK, DiskCacheSettings, Identity, folder_identities
from macspec.prefix.store import DiskStore
from macspec.prefix.writer import Writer

log = logging.getLogger("macspec.prefix")


class DiskTier:
    """An engine's cached models bound to one store."""

    def __init__(self, store: DiskStore, writer: Writer, bindings: list[ModelBinding], tally):
        self.store, self.writer, self.bindings = store, writer, bindings
        self.tally = tally
        """This request's figures (reset by `prepare`)."""

    def prepare(self, prompt: Sequence[int]) -> Tally:
        """Before a generation: restore the deepest cached prefix of `prompt` in every model
        whose cache holds less of it."""
        self.tally.loaded_tokens = self.tally.written_bytes = self.tally.written_blocks = 0
        for index, binding in enumerate(self.bindings):
            loaded = binding.prepare(prompt)
            if index == 0:  # the target's: what the prompt's cached ids count
                self.tally.loaded_tokens = loaded
        return self.tally

    def fill(self, stats: Stats) -> None:
        stats.disk_tokens = self.tally.loaded_tokens
        stats.disk_written_bytes = self.tally.written_bytes

    def flush(self) -> None:
        """Queue what is held in memory (the latest recurrent state) for writing."""
        for binding in self.bindings:
            binding.flush()

    def drain(self, timeout: float | None = 120.0) -> bool:
        """Write everything held and queued; wait until it is on disk."""
        self.flush()
        return self.writer.drain(timeout)


_tiers: weakref.WeakKeyDictionary[Engine, DiskTier] = weakref.WeakKeyDictionary()


def attach(
    engine: Engine,
    identities: dict[str, Identity],
    settings: DiskCacheSettings = DEFAULT_DISK,
    options: CacheOptions | None = None,
) -> DiskTier | None:
    """Bind the engine's cached models to the disk tier (None when it is off: nothing is
    written then). `identities`: by CachedModel name ('target model', 'draft model')."""
    if not settings.enabled:
        return None
    store, writer = _writer(settings)
    tally = Tally()
    bindings = []
    models = [m for m in engine.cached_models() if m.name in identities]
    for model in models:
        identity = identities[model.name]
        kind = blocks.unsupported(model.cache)
        if kind is not None:
            log.info("prompt cache: %s is not cached on disk (its %s)", identity.name, kind)
            continue
        cache_options = options if options is not None else model.options
        root = root_key(identity.fingerprint, settings_text(settings.block, cache_options))
        store.register(identity.fingerprint, {"name": identity.name, "folder": identity.folder})
        bindings.append(
            ModelBinding(
                model,
                store,
                writer,
                identity.fingerprint,
                root,
                settings.block,
                settings.state_every,
                tally,
            )  # fmt: skip
        )
    if not bindings:
        return None
    tier = DiskTier(store, writer, bindings, tally)
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
    the Done's stats say what the disk gave and took (`disk_tokens`, `disk_written_bytes`)."""
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
    if not settings.enabled or not hasattr(engine, "cached_models"):
        return None
    names = {m.name for m in engine.cached_models()}
    draft = resolved.draft if "draft model" in names else None
    identities = folder_identities(
        resolved.target, resolved.target_name, draft, resolved.draft_name
    )
    return attach(engine, identities, settings)
