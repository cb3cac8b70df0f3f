"""How many guesses each row of a batch gets: priced on the measured cost of a batched pass
over the total ids, not on one row's pass alone.

Speculation and batching compete for the same idle compute: a pass over 8 rows of 5 ids each
is no longer nearly free. The padded pass is as wide as its widest row, so the cycle's width
is chosen for all rows together: the one whose expected tokens per second is highest (every
row's expected kept tokens, from its measured acceptance by position, over the batched pass
time for rows x width ids plus the drafting), then a row's last guesses are taken back where
drafting them costs more than they keep. Where
no guess pays at this width (a CPU, or many rows on an M1), the batch decodes plainly, and
the rows' stats say so; guesses are probed now and then so the figures stay fresh.
"""

from __future__ import annotations

from macspec.engine.batch.row import room
from macspec.engine.core.stats import Ema
from macspec.engine.policy.length import AutoPolicy
from macspec.engine.trees.sizing import TreePolicy


class BatchPricing:
    """The measured cost of batched passes, and the draft lengths it makes worth guessing."""

    def __init__(self, max_k: int = 8, probe_every: int = 16):
        self.max_k = max_k
        self.probe_every = probe_every
        self._pass_time: dict[int, Ema] = {}
        self._cycles = 0
        self.plain = False
        """Whether the last allocation gave no row a guess although some could draft."""

    def draft_lengths(self, rows: list) -> list[int]:
        """Each row's draft length (rows: the batch's `Row`s): rows with a cost-aware policy
        priced together on the batched pass, the others as their own policy says."""
        lengths = [0] * len(rows)
        priced = []
        for i, row in enumerate(rows):
            if row.drafter is None or not row.guard.on:
                continue
            if type(row.policy) is AutoPolicy:
                priced.append(i)
            else:
                lengths[i] = row.policy.draft_length()
        if priced:
            widths = [len(rows[i].context) - rows[i].fed for i in priced]
            caps = [room(rows[i]) for i in priced]
            policies = [rows[i].policy for i in priced]
            for i, k in zip(priced, self.allocate(policies, widths, caps)):
                lengths[i] = k
        self.price_trees(rows, lengths)
        return lengths

    def price_trees(self, rows: list, lengths: list[int]) -> None:
        """`--draft-tree auto` rows: each one's tree size, or its chain, for the most expected
        tokens per second of the whole cycle, where a tree's nodes widen the pass that every
        row shares (coordinate ascent over the rows, twice). Chains until passes are timed."""
        options = {
            i: row.policy.options(lengths[i])
            for i, row in enumerate(rows)
            if isinstance(row.policy, TreePolicy) and row.policy.priced_outside
        }
        options = {i: choices for i, choices in options.items() if choices}
        if not options:
            return
        widths = [len(row.context) - row.fed + k for row, k in zip(rows, lengths)]
        tokens = [1.0 + expected_chain(row.policy, k) for row, k in zip(rows, lengths)]
        drafting = [0.0] * len(rows)
        chosen = dict.fromkeys(options, 0)

        def rate() -> float | None:
            verify = self.pass_time(len(rows) * max(widths))
            return None if verify is None else sum(tokens) / (verify + sum(drafting))

        def take(i: int, choice: tuple[int, int, float, float]) -> None:
            nodes, ids, tokens[i], drafting[i] = choice
            widths[i] = len(rows[i].context) - rows[i].fed + ids
            chosen[i] = nodes

        for i, choices in options.items():
            take(i, choices[0])
        if rate() is None:
            return self._assign(rows, chosen)
        # The pass is as wide as its widest row: choose the width first (each row taking its
        # best choice within it), then refine row by row.
        pending = {i: len(rows[i].context) - rows[i].fed for i in options}
        best_rate, best = rate(), [choices[0] for choices in options.values()]
        for width in sorted({pending[i] + c[1] for i, choices in options.items() for c in choices}):
            trial = []
            for i, choices in options.items():
                fits = [c for c in choices if pending[i] + c[1] <= width] or choices[:1]
                trial.append(max(fits, key=lambda choice: choice[2]))
                take(i, trial[-1])
            if (rate() or 0.0) > best_rate:
                best_rate, best = rate(), trial
        for i, choice in zip(options, best):
            take(i, choice)
        for _ in range(2):
            for i, choices in options.items():
                scored = []
                for choice in choices:
                    take(i, choice)
                    scored.append((rate() or 0.0, choice))
                take(i, max(scored, key=lambda scored_choice: scored_choice[0])[1])
        self._assign(rows, chosen)

    @staticmethod
    def _assign(rows: list, chosen: dict[int, int]) -> None:
        for i, nodes in chosen.items():
            rows[i].policy.assign(nodes)

    def observe(self, total_ids: int, seconds: float) -> None:
        """A batched pass over `total_ids` ids (padding included) took `seconds`."""
        self._pass_time.setdefault(total_ids, Ema(0.3)).add(seconds)

    def pass_time(self, m: int) -> float | None:
        """Seconds of a batched pass over m ids: measured, else a linear fit."""
        measured = {n: e.value for n, e in self._pass_time.items() if e.value is not None}
        if m in measured:
            return measured[m]
        if len(measured) < 2:
            return None
        xs, ys = list(measured), list(measured.values())
        mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
        var = sum((x - mean_x) ** 2 for x in xs)
        slope = max(0.0, sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / var)
        return max(1e-9, mean_y + slope * (m - mean_x))

    def allocate(self, policies: list[AutoPolicy], widths: list[int], caps: list[int]) -> list[int]:
        """Guesses per row: `policies` give each row's acceptance by position and its cost per
        guess, `widths` the ids each row feeds anyway, `caps` the most guesses each may take.
        The padded pass is as wide as its widest row times the rows."""
        self._cycles += 1
        ks = [0] * len(policies)
        if (
            self.pass_time(len(widths) * max(widths)) is None
            or self._cycles % self.probe_every == 0
        ):
            # Not priced yet, or a probe: each row guesses as its own policy would.
            ks = [min(p.draft_length(), cap) for p, cap in zip(policies, caps)]
            self.plain = False
            return ks
        # The pass is as wide as its widest row: choose the width first (every row guessing up
        # to it), then take back the guesses that cost more drafting than they keep.
        best_rate, best = self._rate(ks, widths, policies), ks
        for width in range(max(widths) + 1, max(widths) + self.max_k + 1):
            trial = [min(cap, self.max_k, width - w) for w, cap in zip(widths, caps)]
            rate = self._rate(trial, widths, policies)
            if rate is not None and (best_rate is None or rate > best_rate):
                best_rate, best = rate, trial
        ks = list(best)
        for i in range(len(ks)):
            while ks[i] > 0:
                trial = ks[:i] + [ks[i] - 1] + ks[i + 1 :]
                rate = self._rate(trial, widths, policies)
                if rate is None or best_rate is None or rate <= best_rate:
                    break
                ks, best_rate = trial, rate
        self.plain = not any(ks) and any(caps)
        for policy, k in zip(policies, ks):
            policy.last_choice = k
        return ks

    def _rate(self, ks: list[int], widths: list[int], policies: list[AutoPolicy]) -> float | None:
        """Expected tokens per second of a cycle where row i guesses ks[i]."""
        width = max(w + k for w, k in zip(widths, ks))
        verify = self.pass_time(len(ks) * width)
        if verify is None:
            return None
        tokens = sum(1.0 + expected_chain(policy, k) for k, policy in zip(ks, policies))
        drafting = sum(k * p.guess_cost for k, p in zip(ks, policies))
        return tokens / (verify + drafting)


def expected_chain(policy, k: int) -> float:
    """Guesses a row's chain of k is expected to keep (0 where its policy does not measure)."""
    if type(policy) is not AutoPolicy:
        return 0.0
    kept, chain = 0.0, 1.0
    for position in range(1, k + 1):
        chain *= policy.acceptance(position)
        kept += chain
    return kept
