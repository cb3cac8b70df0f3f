"""A model together with its KV cache and the token ids that cache holds.

Knowing the ids is what makes rollback and reuse exact: trimming keeps a prefix of them,
and a new prompt reuses the longest common prefix instead of prefilling from scratch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache

from macspec.errors import MacspecError

PREFILL_CHUNK = 512


def _layer_length(layer_cache: Any) -> int:
    offset = getattr(layer_cache, "offset", None)
    return int(offset) if isinstance(offset, int) else int(layer_cache.size())


class CachedModel:
    """A language model, its KV cache, and `tokens`: exactly the ids the cache has seen."""

    def __init__(self, model: nn.Module, name: str = "model", cache: list[Any] | None = None):
        self.model = model
        self.name = name
        self.cache = cache if cache is not None else make_prompt_cache(model)
        self._tokens: list[int] = []
        # Ids fed as unevaluated arrays (a draft feeding its own guesses), resolved on demand
        # so drafting never waits for a sync just to keep this bookkeeping.
        self._lazy: list[mx.array] = []

    @property
    def tokens(self) -> list[int]:
        if self._lazy:
            for array in self._lazy:
                self._tokens.extend(array.tolist())
            self._lazy = []
        return self._tokens

    @property
    def trimmable(self) -> bool:
        return can_trim_prompt_cache(self.cache)

    def require_trimmable(self) -> None:
        """Speculation rolls caches back after every rejection; refuse early if it can't."""
        if not self.trimmable:
            kinds = sorted({type(c).__name__ for c in self.cache if not c.is_trimmable()})
            raise MacspecError(
                f"{self.name}: its cache ({', '.join(kinds)}) cannot be rolled back, "
                "so it cannot be used for speculative decoding (try --no-draft)"
            )

    def __len__(self) -> int:
        return len(self._tokens) + sum(a.size for a in self._lazy)

    def forward(self, ids: Sequence[int] | mx.array) -> mx.array:
        """Feed ids through the model, extending the cache; returns logits (len(ids), V), lazily."""
        if isinstance(ids, mx.array):
            array = ids
            self._lazy.append(ids)
        else:
            array = mx.array(list(ids), mx.uint32)
            self.tokens.extend(ids)
        return self.model(array[None], cache=self.cache)[0]

    def prefill(self, ids: Sequence[int]) -> None:
        """Feed ids in chunks, evaluating as it goes so memory stays bounded on long prompts."""
        for start in range(0, len(ids), PREFILL_CHUNK):
            self.forward(ids[start : start + PREFILL_CHUNK])
            mx.eval([c.state for c in self.cache])

    def trim_to(self, length: int) -> None:
        """Keep only the first `length` tokens in the cache.

        Works per layer from each layer's own length, so a forward pass interrupted halfway
        (Ctrl-C between layers) still leaves every layer at the same, consistent length.
        """
        lengths = [_layer_length(c) for c in self.cache]
        length = max(0, min([length, len(self.tokens), *lengths]))
        if any(n > length for n in lengths):
            self.require_trimmable()
            for layer_cache, n in zip(self.cache, lengths):
                if n > length:
                    layer_cache.trim(n - length)
        del self.tokens[length:]

    def reuse(self, prompt: Sequence[int]) -> list[int]:
        """Keep the cached prefix shared with `prompt`; return the ids still to be fed.

        At least one id is always left to feed: its logits are what predicts the next token.
        """
        shared = 0
        limit = min(len(self.tokens), len(prompt) - 1)
        while shared < limit and self.tokens[shared] == prompt[shared]:
            shared += 1
        if shared < len(self.tokens) and not self.trimmable:
            # Nothing reusable without a rollback: start this model's cache over.
            self.cache = make_prompt_cache(self.model)
            self._tokens, self._lazy = [], []
            shared = 0
        self.trim_to(shared)
        return list(prompt[shared:])
