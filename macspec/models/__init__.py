"""Models on disk and in memory: catalog, downloads, loading, memory, home, templates."""

from macspec._lazy import lazy_exports

__getattr__, __all__ = lazy_exports(
    __name__,
    {
        "Catalog": "catalog",
        "Pair": "catalog",
        "ResolvedModels": "catalog",
        "load_catalog": "catalog",
        "pair_status": "catalog",
        "resolve_models": "catalog",
        "LoadedModels": "loader",
        "load_models": "loader",
        "build_engine": "build",
        "make_drafter": "build",
        "macspec_home": "home",
        "MemoryEstimate": "memory",
        "estimate": "memory",
        "encode_messages": "templates",
        "encode_prompt": "templates",
    },
)
