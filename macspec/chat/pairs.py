"""Loading a pair for a chat: models resolved and loaded into an engine, with what the
session needs to know about them (names, context window, warnings)."""

from __future__ import annotations

from dataclasses import dataclass

from macspec.chat.records import ModelInfo
from macspec.engine.caches.cached import CacheOptions
from macspec.engine.generate.loop import Engine
from macspec.models.catalog import Pair, ResolvedModels, load_catalog, pair_status
from macspec.models.pairs import open_pair
from macspec.prefix.settings import DEFAULT_DISK, DiskCacheSettings
from macspec.prefix.tier import attach_pair


@dataclass(frozen=True)
class ChatModels:
    """A loaded target (and draft), ready for a ChatSession."""

    engine: Engine
    """The engine, with its drafter and policy."""
    tokenizer: object
    """The target's tokenizer (mlx-lm's TokenizerWrapper)."""
    models: ModelInfo
    """What was loaded, as the user named it (stored with each answer)."""
    context_length: int | None
    """The pair's context window; from the target's config.json without a pair."""
    warnings: tuple[str, ...] = ()
    """Things the user should know about the pair (shown as notices)."""


def open_models(
    resolved: ResolvedModels,
    num_draft_tokens: str | None = None,
    no_draft: bool = False,
    draft: str | None = None,
    cache_options: CacheOptions | None = None,
    group=None,
    watchdog=None,
    draft_tree: str | None = None,
    disk_cache: DiskCacheSettings | None = None,
) -> ChatModels:
    """Load resolved models into an engine (slow: run it off the UI thread); with an
    mlx.distributed `group`, the target sharded over its ranks (see `build_engine`).
    The prompt cache on disk serves the engine (`disk_cache`: by default 10 GB in the macspec
    home), except on a sharded target."""
    opened = open_pair(
        resolved, num_draft_tokens, no_draft, draft, cache_options, group, watchdog,
        draft_tree=draft_tree,
    )  # fmt: skip
    engine = opened.engine
    if group is None:
        attach_pair(engine, resolved, disk_cache or DEFAULT_DISK)
    models = ModelInfo(
        target=resolved.target_name,
        draft=resolved.draft_name if engine.drafter is not None else None,
        pair=resolved.pair.name if resolved.pair is not None else None,
    )
    return ChatModels(engine, opened.tokenizer, models, opened.context_length, opened.warnings)


def downloaded_pairs() -> list[Pair]:
    """Catalog pairs whose target and draft are both on this machine."""
    return [pair for pair in load_catalog().pairs.values() if pair_status(pair).downloaded]
