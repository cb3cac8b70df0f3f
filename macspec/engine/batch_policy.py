"""How many guesses each row of a batch gets: priced on the measured cost of a batched pass
over the total ids, not on one row's pass alone.

Speculation and batching compete for the same idle compute: a pass over 8 rows of 5 ids each
is no longer nearly free. So the cycle's guesses are allocated across rows together: starting
from none, the next guess goes to the row whose next guess is likeliest to be kept (its
measured acceptance by position), as long as the expected tokens per second of the whole
cycle rise (tokens kept over the batched pass time for the total ids, plus drafting). Where
no guess pays at this width (a CPU, or many rows on an M1), the batch decodes plainly, and
the rows' stats say so; guesses are probed now and then so the figures stay fresh.
"""

from __future__ import annotations

from macspec.engine.policy import AutoPolicy
from macspec.engine.stats import Ema


class BatchPricing:
    """The measured cost of batched passes, and the draft lengths it makes worth guessing."""

    def __init__(self, max_k: int = 8, probe_every: int = 16):
        self.max_k = max_k
        self.probe_every = probe_every
        self._pass_time: dict[int, Ema] = {}
        self._cycles = 0
        self.plain = False
        """Whether the last allocation gave no row a guess although some could draft."""

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
        chains = [1.0] * len(policies)
        tokens = float(len(policies))
        best = self._rate(tokens, ks, widths, policies)
        while True:
            candidates = [
                (chains[i] * policies[i].acceptance(ks[i] + 1), i)
                for i in range(len(ks))
                if ks[i] < min(caps[i], self.max_k)
            ]
            if not candidates:
                break
            gain, i = max(candidates)
            ks[i] += 1
            rate = self._rate(tokens + gain, ks, widths, policies)
            if rate is None or rate <= best:
                ks[i] -= 1
                break
            best, tokens, chains[i] = rate, tokens + gain, chains[i] * policies[i].acceptance(ks[i])
        self.plain = not any(ks) and any(caps)
        for policy, k in zip(policies, ks):
            policy.last_choice = k
        return ks

    def _rate(self, tokens: float, ks: list[int], widths: list[int], policies) -> float | None:
        width = max(w + k for w, k in zip(widths, ks))
        verify = self.pass_time(len(ks) * width)
        if verify is None:
            return None
        drafting = sum(k * p.guess_cost for k, p in zip(ks, policies))
        return tokens / (verify + drafting)
