"""Drafting without a draft model: prompt lookup (n-grams of the context), and a hybrid.

Chat answers often repeat their context: code being edited, a text being summarised, names
from earlier turns. `LookupDrafter` finds the latest earlier occurrence of the context's last
n-gram and proposes the tokens that followed it: no second model, no forward pass.
`HybridDrafter` takes a long lookup match when it has one and asks the draft model otherwise,
and learns from what the target kept which of the two to trust.

Lookup guesses are deterministic (`Draft.q` is None), which `verify_sampled` treats as a one-hot
q: a guess x is kept with probability p(x), else the target samples from p with x removed, so
sampled output keeps the target's distribution exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from macspec.engine.caches.cached import CachedModel
from macspec.engine.core.sampling import Draws, SamplingParams
from macspec.engine.core.stats import Ema
from macspec.engine.drafters.protocol import Draft, Drafter


@dataclass(frozen=True)
class Match:
    """What the index found for the end of a context."""

    ngram: int
    """Length of the matched n-gram (the context's last `ngram` ids)."""
    start: int
    """Position in the context where the proposed continuation begins."""
    tokens: list[int]
    """The continuation: ids that followed the latest earlier occurrence of the n-gram."""


class NgramIndex:
    """The ids of a context and, for each n-gram in it, where it last occurred.

    `latest[gram]` is the position right after the gram's latest occurrence that has at least
    one id after it, so the context's own trailing n-gram never matches itself. Appending an id
    registers one n-gram per size; truncating undoes those registrations newest first, from an
    undo log of the position each registration replaced, so both are O(1) per id.
    """

    def __init__(self, sizes: Sequence[int]):
        self.sizes = tuple(sorted(set(sizes), reverse=True))
        if not self.sizes or self.sizes[-1] < 1:
            raise ValueError(f"n-gram sizes must be positive, got {sizes}")
        self.tokens: list[int] = []
        self.latest: dict[tuple[int, ...], int] = {}
        # _replaced[j][i]: what latest[gram] held before the id at i registered the gram of
        # size sizes[j] ending just before it (-1: nothing). Parallel to `tokens`.
        self._replaced: list[list[int]] = [[] for _ in self.sizes]
        self.updates = 0
        """Registrations and undos done so far: the index's work, for tests and profiling."""

    def __len__(self) -> int:
        return len(self.tokens)

    def append(self, token: int) -> None:
        at = len(self.tokens)
        self.tokens.append(token)
        for n, replaced in zip(self.sizes, self._replaced):
            if at < n:
                replaced.append(-1)
                continue
            gram = tuple(self.tokens[at - n : at])
            replaced.append(self.latest.get(gram, -1))
            self.latest[gram] = at
            self.updates += 1

    def truncate(self, length: int) -> None:
        """Keep the first `length` ids, restoring each n-gram's earlier occurrence."""
        for at in range(len(self.tokens) - 1, max(length, 0) - 1, -1):
            for n, replaced in zip(self.sizes, self._replaced):
                previous = replaced.pop()
                if at < n:
                    continue
                gram = tuple(self.tokens[at - n : at])
                if previous < 0:
                    del self.latest[gram]
                else:
                    self.latest[gram] = previous
                self.updates += 1
            self.tokens.pop()

    def match(self, limit: int, min_ngram: int = 1) -> Match | None:
        """The longest n-gram (>= min_ngram) ending the ids that occurred before, and up to
        `limit` ids that followed its latest occurrence (never past the end of the ids)."""
        end = len(self.tokens)
        if limit < 1:
            return None
        for n in self.sizes:
            if n < min_ngram or n > end:
                continue
            start = self.latest.get(tuple(self.tokens[end - n :]))
            if start is not None:
                return Match(n, start, self.tokens[start : min(start + limit, end)])
        return None


class LookupDrafter(Drafter):
    """Prompt lookup: guesses the continuation of the context's last n-gram from earlier on.

    The context (prompt and generated text) is indexed incrementally: each `propose` indexes
    only the ids that arrived since the last call, after checking them against what it already
    has, so rollbacks and a chat's next prompt keep the index exact at O(1) amortised per id.
    """

    name = "lookup"

    def __init__(
        self,
        max_ngram: int = 3,
        min_ngram: int = 1,
        max_guess: int = 16,
        guess_per_ngram: int | None = 2,
    ):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        if max_guess < 1 or (guess_per_ngram is not None and guess_per_ngram < 1):
            raise ValueError(f"guess limits must be >= 1, got {max_guess}, {guess_per_ngram}")
        self.index = NgramIndex(range(min_ngram, max_ngram + 1))
        self.max_ngram = max_ngram
        self.max_guess = max_guess
        """Most ids one lookup proposes; the policy's k caps it too (k <= 8 by default)."""
        self.guess_per_ngram = guess_per_ngram
        """A match shorter than max_ngram proposes at most this many ids per matched id (None:
        no such cap). Short matches are often wrong early; on the demo pair this cap halves the
        ids verified per pass for 2% fewer tokens per pass, and full matches keep all of k."""
        # Leading ids of the index known to equal the engine's context (rollback lowers it).
        self._trusted = 0

    def start(self, prompt: Sequence[int]) -> None:
        self._trusted = 0  # a new prompt: check every id once against what is indexed
        self.sync(prompt)

    def rollback(self, keep: int) -> None:
        # Lazy: the next sync compares from here and undoes only ids that really changed,
        # so the engine's per-cycle rollback of the id it is about to feed back costs nothing.
        self._trusted = min(self._trusted, keep)

    def sync(self, context: Sequence[int]) -> None:
        """Make the index hold exactly `context`: keep the shared prefix, index the rest."""
        index = self.index
        shared, limit = self._trusted, min(len(index), len(context))
        while shared < limit and index.tokens[shared] == context[shared]:
            shared += 1
        index.truncate(shared)
        for token in context[shared:]:
            index.append(int(token))
        self._trusted = len(context)

    def match(self, context: Sequence[int], k: int, min_ngram: int = 1) -> Match | None:
        """Index `context` and look up the continuation of its end (at most k ids)."""
        self.sync(context)
        found = self.index.match(min(k, self.max_guess), min_ngram)
        if found is None or self.guess_per_ngram is None or found.ngram >= self.max_ngram:
            return found
        return replace(found, tokens=found.tokens[: self.guess_per_ngram * found.ngram])

    def propose(
        self,
        context: Sequence[int],
        k: int,
        params: SamplingParams,
        draws: Draws | None,
        confidence_floor: float | None,
    ) -> Draft:
        # Deterministic guesses have no confidence to stop on: `confidence_floor` is unused.
        found = self.match(context, k)
        return Draft(tokens=found.tokens if found else [], q=None, source=self.name)


@dataclass
class _Pending:
    """The last cycle's guesses, scored once the next context shows what the target kept."""

    at: int
    """Length of the context they were guessed after."""
    source: str
    """'lookup' or 'model': who was asked."""
    draft: Draft
    """What was proposed (its tokens: the guesses that counted, once the engine read them)."""
    lookup_guess: list[int] | None
    """The long lookup match there was (proposed or not); None when there was none."""


def _kept(guess: Sequence[int], committed: Sequence[int]) -> int:
    """How many guesses the target kept: its next ids agree with a kept prefix and differ at
    the first rejection (greedy: its argmax; sampled: the residual excludes the guess)."""
    n = 0
    while n < len(guess) and n < len(committed) and guess[n] == committed[n]:
        n += 1
    return n


class HybridDrafter(Drafter):
    """A long lookup match when there is one and it has earned trust, else the draft model.

    Trust is measured where the choice is made, on contexts with a long match: a decayed mean
    of guesses kept per cycle for each source. Lookup's figure is known on every such cycle,
    because its guess costs nothing to score against the ids the target committed even when the
    model was asked (a lower bound: at most the committed ids can be confirmed). The model's
    figure comes from the cycles it drafted there, and every `probe_every`-th long match asks
    the model anyway, so its figure never goes stale. Lookup wins ties: its guesses are free.

    Learning needs nothing from the engine: the next `propose` receives the committed context,
    and the ids after the last proposal show how many of its guesses were kept.
    """

    name = "hybrid"

    def __init__(
        self,
        model: Drafter,
        lookup: LookupDrafter | None = None,
        min_ngram: int = 2,
        min_guess: int = 2,
        probe_every: int = 8,
        weight: float = 0.2,
    ):
        self.model = model
        """The model drafter (a `ModelDrafter`); it catches up on ids it did not see."""
        self.lookup = lookup if lookup is not None else LookupDrafter()
        self.min_ngram = min_ngram
        """A match counts as long from this n-gram size ..."""
        self.min_guess = min_guess
        """... and this many ids of continuation."""
        self.probe_every = probe_every
        self.kept = {"lookup": Ema(weight), "model": Ema(weight)}
        """Guesses kept per cycle on contexts with a long match, by source."""
        self._long_matches = 0
        self._pending: _Pending | None = None

    def start(self, prompt: Sequence[int]) -> None:
        self._pending = None  # its outcome is not in the new prompt
        self.model.start(prompt)
        self.lookup.start(prompt)

    def rollback(self, keep: int) -> None:
        # Both, always: the model drafter's cache must hold only committed ids.
        self.model.rollback(keep)
        self.lookup.rollback(keep)
        if self._pending is not None and keep < self._pending.at:
            self._pending = None  # the context shrank below the proposal: nothing to learn

    def caches(self) -> list[CachedModel]:
        return self.model.caches()

    def prefers_lookup(self) -> bool:
        lookup, model = self.kept["lookup"].value, self.kept["model"].value
        if lookup is None:
            return True  # a first long match: its outcome is free to learn
        if model is None or self._long_matches % self.probe_every == 0:
            return False  # probe: learn the model's figure, and keep it fresh
        return lookup >= model

    def propose(
        self,
        context: Sequence[int],
        k: int,
        params: SamplingParams,
        draws: Draws | None,
        confidence_floor: float | None,
    ) -> Draft:
        self._learn(context)
        found = self.lookup.match(context, k, self.min_ngram)
        long = found if found is not None and len(found.tokens) >= self.min_guess else None
        if long is not None:
            self._long_matches += 1
        if long is not None and self.prefers_lookup():
            draft = Draft(tokens=long.tokens, q=None, source=self.lookup.name)
        else:
            draft = self.model.propose(context, k, params, draws, confidence_floor)
        lookup_guess = long.tokens if long is not None else None
        self._pending = _Pending(len(context), draft.source, draft, lookup_guess)
        return draft

    def _learn(self, context: Sequence[int]) -> None:
        pending, self._pending = self._pending, None
        if pending is None or pending.lookup_guess is None or len(context) <= pending.at:
            return  # only contexts with a long match inform the choice
        committed = context[pending.at :]
        if pending.source == "model":
            self.kept["model"].add(_kept(list(pending.draft.tokens), committed))
        self.kept["lookup"].add(_kept(pending.lookup_guess, committed))
