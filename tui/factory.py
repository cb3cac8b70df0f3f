"""`make_app`, the one factory the CLI and the tests use to build the chat app."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from macspec.chat.session import ChatModels, ChatSession, downloaded_pairs, open_models
from macspec.chat.store import ModelInfo, Store
from macspec.engine.caches.cached import CacheOptions
from macspec.engine.generate.loop import Engine, GenerationConfig
from macspec.models.catalog import Pair, resolve_models
from macspec.models.flags import needs_draft_model
from macspec.prefix.settings import DiskCacheSettings
from tui.app import ChatApp


def default_pair_loader(
    num_draft_tokens: str | None = None,
    no_draft: bool = False,
    draft: str | None = None,
    cache_options: CacheOptions | None = None,
    draft_tree: str | None = None,
    disk_cache: DiskCacheSettings | None = None,
) -> Callable[[Pair], ChatModels]:
    """Loads a catalog pair from disk with the command line's draft and cache settings."""

    def load(pair: Pair) -> ChatModels:
        resolved = resolve_models(
            pair.name, None, None, need_draft=needs_draft_model(draft, no_draft)
        )
        return open_models(
            resolved,
            num_draft_tokens,
            no_draft,
            draft,
            cache_options,
            draft_tree=draft_tree,
            disk_cache=disk_cache,
        )

    return load


def make_app(
    engine: Engine,
    tokenizer,
    *,
    store: Store | None = None,
    models: ModelInfo | None = None,
    config: GenerationConfig | None = None,
    context_length: int | None = None,
    conversation_id: int | None = None,
    list_pairs: Callable[[], Sequence[Pair]] | None = None,
    load_pair: Callable[[Pair], ChatModels] | None = None,
    warnings: Sequence[str] = (),
    mask_timings: bool = False,
    system_prompt: str | None = None,
    template_args: dict | None = None,
    exit_on_signals: bool = False,
) -> ChatApp:
    """The chat app around a ready engine; tests inject tiny models, a fake catalog and loader.

    An unknown `conversation_id` is a MacspecError here, before the app starts.
    """
    session = ChatSession(
        engine,
        tokenizer,
        store if store is not None else Store(),
        conversation_id=conversation_id,
        config=config,
        context_length=context_length,
        models=models,
        system_prompt=system_prompt,
        template_args=template_args,
    )
    return ChatApp(
        session,
        list_pairs=list_pairs if list_pairs is not None else downloaded_pairs,
        load_pair=load_pair if load_pair is not None else default_pair_loader(),
        warnings=warnings,
        mask_timings=mask_timings,
        exit_on_signals=exit_on_signals,
    )
