"""Opening a pair: models resolved and loaded into an engine, with what the commands need to
know about them (the context window, warnings). The chat, the server and the bench open
pairs here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from macspec.engine.caches.cached import DEFAULT_CACHE, CacheOptions
from macspec.models import build
from macspec.models.catalog import ResolvedModels, context_length


@dataclass(frozen=True)
class OpenPair:
    """A loaded target (and drafters), ready to generate."""

    engine: Any
    """The engine: an Engine (one sequence at a time, perhaps sharded) or a BatchEngine."""
    tokenizer: object
    """The target's tokenizer (mlx-lm's TokenizerWrapper)."""
    context_length: int | None
    """The pair's context window; from the target's config.json without a pair."""
    warnings: tuple[str, ...] = ()
    """Things the user should know about the pair (shown as notices)."""
    drafting: bool = False
    """Whether the engine drafts (else it decodes plainly)."""


def open_pair(
    resolved: ResolvedModels,
    num_draft_tokens: str | None = None,
    no_draft: bool = False,
    draft: str | None = None,
    cache_options: CacheOptions | None = None,
    group=None,
    watchdog=None,
    batch: bool = False,
    draft_tree: str | None = None,
) -> OpenPair:
    """Load resolved models into an engine (slow: run it off a UI thread). With an
    mlx.distributed `group`, the target sharded over its ranks (see `build_engine`); with
    `batch`, an engine that decodes several requests together."""
    options = cache_options or DEFAULT_CACHE
    if batch:
        engine, loaded = build.build_batch_engine(
            resolved, num_draft_tokens, no_draft, draft, options, draft_tree
        )
        drafting = engine.new_drafter is not None
    else:
        engine, loaded = build.build_engine(
            resolved, num_draft_tokens, no_draft, draft, options, group, watchdog, draft_tree
        )
        drafting = engine.drafter is not None
    context = context_length(resolved)
    return OpenPair(engine, loaded.tokenizer, context, tuple(loaded.warnings), drafting)
