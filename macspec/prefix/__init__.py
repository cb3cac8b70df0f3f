"""The prompt cache below chat, serve and run: block keys (a hash chain over ids under the
model's identity), the disk tier (checksummed block files, LRU eviction), and its binding to
an engine's caches. The engine hands it cache states and takes them back; only this package
opens the files."""

from macspec._lazy import lazy_exports

__getattr__, __all__ = lazy_exports(
    __name__,
    {
        "DiskCacheSettings": "settings",
        "DiskTier": "tier",
        "Identity": "settings",
        "folder_identities": "settings",
        "attach": "tier",
        "generate": "tier",
        "tier_of": "tier",
        "DiskStore": "store",
    },
)
