"""Suffix decoding (Oliaro et al. 2025): guesses from everything already said, this request's
prompt and answer and earlier requests' too, with no draft model.

`SaidTokens` holds the sequences said so far, one flat list, bounded in ids (the oldest
sequences go first). Each position is indexed by the `key` ids before it in a hash chain, as
zlib indexes its window: a dict from the key to its latest position, and a list linking every
position to the previous one with the same key. Memory is O(ids), an update is O(1) per id.

A proposal matches the longest suffix of the context, up to `max_depth` ids: it walks the chain
of the context's last key ids (the most recent `max_candidates` occurrences) and measures each
occurrence's match backwards. The occurrences with the longest match vote on what follows:
the chain follows the most frequent continuation while its share of the votes stays at least
`min_prob`, for at most `factor` times the match length ids. Its guesses are deterministic
(q one-hot), so the verdict is exact as for prompt lookup.
"""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from macspec.engine.core.sampling import Draws, SamplingParams
from macspec.engine.drafters.protocol import Draft, Drafter

END = -1
"""Between two sequences: no match runs across it."""


@dataclass(frozen=True)
class Continuation:
    """What a suffix match proposes."""

    matched: int
    """Ids of the context's end matched (the longest match found)."""
    tokens: list[int]
    """The proposed continuation."""
    votes: int
    """Occurrences with that match length."""


class SaidTokens:
    """Sequences said so far, indexed for suffix matches; shared by every request of a model."""

    def __init__(
        self,
        max_tokens: int = 1_000_000,
        key: int = 2,
        max_depth: int = 32,
        max_candidates: int = 64,
    ):
        self.max_tokens, self.key = max_tokens, key
        self.max_depth, self.max_candidates = max_depth, max_candidates
        self.tokens = array("l")  # machine ints: a million ids in 8 MB, not 36
        self._previous = array("l")  # per position: the previous one with the same key
        self._latest: dict[tuple[int, ...], int] = {}
        self._base = 0  # positions before it are evicted (they still sit in the lists)
        self._starts: list[int] = []  # where each sequence starts, oldest first

    def __len__(self) -> int:
        """Ids held (evicted ones not counted)."""
        return len(self.tokens) - self._base

    def begin(self) -> int:
        """Start a new sequence; its first position."""
        if self.tokens and self.tokens[-1] != END:
            self._append(END)
        self._starts.append(len(self.tokens))
        return len(self.tokens)

    def extend(self, ids: Sequence[int]) -> None:
        """Append ids to the current sequence."""
        for token in ids:
            self._append(int(token))
        if len(self) > self.max_tokens:
            self._evict()

    def _append(self, token: int) -> None:
        at = len(self.tokens)
        self.tokens.append(token)
        gram = tuple(self.tokens[at - self.key : at]) if at >= self.key else None
        if gram is None or END in gram or token == END:
            self._previous.append(-1)
            return
        self._previous.append(self._latest.get(gram, -1))
        self._latest[gram] = at

    def _evict(self) -> None:
        """Drop the oldest sequences until the bound holds; compact when half is dead."""
        while len(self) > self.max_tokens and len(self._starts) > 1:
            self._starts.pop(0)
            self._base = self._starts[0]
        if self._base > len(self.tokens) // 2:
            kept, offset = self.tokens[self._base :], self._base
            self.tokens, self._previous = array("l"), array("l")
            self._latest, self._base = {}, 0
            self._starts = [s - offset for s in self._starts]
            for token in kept:
                self._append(token)

    def continuation(self, context: Sequence[int], limit: int, factor: float, min_prob: float):
        """The continuation of the context's longest matched suffix, or None."""
        if limit < 1 or len(context) < self.key:
            return None
        tail = [int(t) for t in context[-self.max_depth :]]
        at = self._latest.get(tuple(tail[-self.key :]), -1)
        best, found = 0, []
        for _ in range(self.max_candidates):
            if at < self._base:
                break
            length = self._matched(tail, at)
            if length > best:
                best, found = length, [at]
            elif length == best:
                found.append(at)
            at = self._previous[at]
        if not found:
            return None
        size = min(limit, max(1, int(factor * best)))
        return Continuation(best, self._vote(found, size, min_prob), len(found))

    def _matched(self, tail: list[int], at: int) -> int:
        """How many ids before position `at` equal the tail's end."""
        n, tokens = 0, self.tokens
        while n < len(tail) and at - 1 - n >= self._base and tokens[at - 1 - n] == tail[-1 - n]:
            n += 1
        return n

    def _vote(self, starts: list[int], size: int, min_prob: float) -> list[int]:
        """The most frequent continuation of the occurrences, id by id, while it keeps at
        least `min_prob` of the votes of the occurrences that agree so far."""
        out: list[int] = []
        alive, tokens = starts, self.tokens
        for depth in range(size):
            # An occurrence whose continuation reaches the end of what is held (the context's
            # own latest ids, say) has no vote from there on, and stays out of the agreeing set.
            alive = [s for s in alive if s + depth < len(tokens)]
            votes = Counter(tokens[s + depth] for s in alive)
            votes.pop(END, None)
            if not votes:
                break
            token, count = votes.most_common(1)[0]
            if count < min_prob * len(alive):
                break
            out.append(token)
            alive = [s for s in alive if tokens[s + depth] == token]
        return out


class SuffixDrafter(Drafter):
    """Guesses the continuation of the context's longest suffix said before (`said`, shared
    by a model's requests); the context itself is added to `said` as it grows."""

    name = "suffix"

    def __init__(
        self,
        said: SaidTokens | None = None,
        factor: float = 2.0,
        min_prob: float = 0.1,
        max_guess: int = 16,
    ):
        self.said = said if said is not None else SaidTokens()
        self.factor, self.min_prob, self.max_guess = factor, min_prob, max_guess
        self._start = self.said.begin()
        self._fed: list[int] = []  # this sequence's ids in `said`

    def start(self, prompt: Sequence[int]) -> None:
        """A new generation: its prompt continues this sequence of `said` where it extends
        it (a chat's next turn), else it starts a new one (what came before stays said)."""
        fed = self._fed
        if len(fed) > len(prompt) or [int(t) for t in prompt[: len(fed)]] != fed:
            self._start, self._fed = self.said.begin(), []
        self._sync(prompt)

    def rollback(self, keep: int) -> None:
        pass  # committed ids stay said; within a generation the context only grows

    def _sync(self, context: Sequence[int]) -> None:
        """Add the context's new ids to this sequence of `said`."""
        more = [int(t) for t in context[len(self._fed) :]]
        self.said.extend(more)
        self._fed += more

    def match(self, context: Sequence[int], k: int, min_ngram: int = 1) -> Continuation | None:
        """The continuation of the context (at most k ids), or None: shorter than min_ngram."""
        self._sync(context)
        found = self.said.continuation(context, min(k, self.max_guess), self.factor, self.min_prob)
        return found if found is not None and found.matched >= min_ngram else None

    def propose(
        self,
        context: Sequence[int],
        k: int,
        params: SamplingParams,
        draws: Draws | None,
        confidence_floor: float | None,
    ) -> Draft:
        found = self.match(context, k)
        return Draft(tokens=found.tokens if found else [], q=None, source=self.name)
