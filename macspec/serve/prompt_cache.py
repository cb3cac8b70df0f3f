"""The prompt cache across requests: the engine's live caches, plus an LRU of saved ones.

Chat clients resend the whole conversation with every request. The engine already reuses the
longest prefix its live caches share with a new prompt, which serves one conversation; with
several clients taking turns, each would evict the others'. So, as mlx-lm's `LRUPromptCache`
does, the states of other conversations are kept: before a request, if a saved state shares
more of its prompt than the live caches do, it is loaded in their place; if the live caches
are about to lose ids (the new prompt leaves their path), they are saved first.

A saved state holds new handles to the cache arrays, not copies; a buffer is copied once when
the live cache writes into it while a saved state still holds it. So memory is bounded by
`size` + 1 caches, each as long as its conversation.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from macspec.engine.caches.cached import SavedCache
from macspec.engine.generate.loop import Engine


def shared_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two id sequences."""
    n, limit = 0, min(len(a), len(b))
    while n < limit and a[n] == b[n]:
        n += 1
    return n


@dataclass(frozen=True)
class Entry:
    """The saved caches of every model of the engine, at one sequence of ids."""

    tokens: tuple[int, ...]
    """The ids the target's cache held (the key)."""
    saved: list[SavedCache]
    """One per `Engine.cached_models()`, in that order."""


class PromptCache:
    """Which cached state a request starts from. Used by the one thread that owns the engine."""

    def __init__(self, engine: Engine, size: int = 4):
        self.engine = engine
        self.size = max(0, size)
        """Most saved states besides the live one (0: the live caches only)."""
        self.entries: OrderedDict[tuple[int, ...], Entry] = OrderedDict()
        """Saved states, least recently used first."""
        self.hits = 0
        """Requests that started from a saved state rather than the live one."""

    def prepare(self, prompt: Sequence[int]) -> None:
        """Put the state sharing most of `prompt` in the engine's live caches."""
        if self.size == 0:
            return
        live = tuple(self.engine.target.tokens)
        live_shared = shared_prefix(live, prompt)
        scored = [(shared_prefix(e.tokens, prompt), e) for e in self.entries.values()]
        best_shared, best = max(scored, key=lambda s: s[0], default=(0, None))
        if best is not None and best_shared > live_shared:
            del self.entries[best.tokens]  # first: saving the live state may evict entries
            self._save(live)
            for model, saved in zip(self.engine.cached_models(), best.saved):
                model.load(saved)
            self.hits += 1
        elif live_shared < len(live):  # the engine would trim ids another request may want
            self._save(live)

    def _save(self, tokens: tuple[int, ...]) -> None:
        if not tokens:
            return
        for key in list(self.entries):
            if key[: len(tokens)] == tokens:  # a longer state holds this one already
                self.entries.move_to_end(key)
                return
            if tokens[: len(key)] == key:  # this one extends a saved state: replace it
                del self.entries[key]
        try:
            saved = [model.save() for model in self.engine.cached_models()]
        except TypeError:  # a cache that cannot be snapshot: serve from the live one only
            self.size = 0
            self.entries.clear()
            return
        self.entries[tokens] = Entry(tokens, saved)
        while len(self.entries) > self.size:
            self.entries.popitem(last=False)
