"""Conversations: a chat session over one engine, and its SQLite store."""

from macspec._lazy import lazy_exports

__getattr__, __all__ = lazy_exports(
    __name__,
    {
        "ChatModels": "session",
        "ChatSession": "session",
        "open_models": "session",
        "ModelInfo": "store",
        "Store": "store",
    },
)
