"""What the theory predicts from this device's verify cost, next to what `macspec bench`
measured: (1 - a^(k+1)) / ((1 - a)(k c + T(k+1)/T(1))). Pure functions, as in bench.py.

c, the cost of one guess, depends on where guesses come from: a draft model's step, or, for
prompt lookup, an index lookup that runs no forward pass at all."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from macspec.bench.figures import MACSPEC, MLX_LM, BenchConfig, ConfigSummary, ratio


@dataclass(frozen=True)
class CostCurve:
    """This device's cost of verifying: a target pass over m ids, and a draft step."""

    target_s: tuple[float, ...]
    """target_s[m - 1]: median seconds of a target pass over m ids on a warm cache."""
    draft_s: float | None
    """Median seconds of one draft model step (a pass over 1 id); None without a draft model."""
    lookup_s: float = 0.0
    """Median seconds of prompt lookup per id it proposed (an n-gram index lookup)."""

    @property
    def relative(self) -> tuple[float, ...]:
        """T(m) / T(1) for m = 1, 2, ...: about m on a CPU, about 1 up to ~8 on Apple GPUs."""
        return tuple(t / self.target_s[0] for t in self.target_s)

    @property
    def draft_cost(self) -> float | None:
        """c: a draft step over a target pass of one id (None: no draft model timed)."""
        return None if self.draft_s is None else self.draft_s / self.target_s[0]

    @property
    def lookup_cost(self) -> float:
        """c for prompt lookup: its seconds per guessed id over a target pass of one id."""
        return self.lookup_s / self.target_s[0]

    def guess_cost(self, config: BenchConfig, draft_source: str) -> float | None:
        """The c of a configuration: mlx-lm always drafts with its model; macspec by its own
        source, or `draft_source`. A hybrid is priced as its model (an upper bound: it asks the
        model whenever no long lookup match exists). None where nothing priced it (an MTP head,
        a DFlash drafter or an EAGLE-3 head: no draft-model step to time)."""
        source = "model" if config.tool == MLX_LM else (config.source or draft_source)
        if source == "lookup":
            return self.lookup_cost
        if source in ("mtp", "dflash", "eagle3") or self.draft_s is None:
            return None
        return self.draft_cost


def predicted_tokens_per_pass(a: float, k: int) -> float:
    """Expected ids per cycle of k guesses, each kept with chance a given the ones before."""
    return float(k + 1) if a >= 1 else (1 - a ** (k + 1)) / (1 - a)


def predicted_speedup(a: float, k: int, c: float, relative: Sequence[float]) -> float:
    """(1 - a^(k+1)) / ((1 - a)(k c + T(k+1)/T(1))): over plain decoding, overheads aside."""
    return predicted_tokens_per_pass(a, k) / (k * c + relative[k])


def predicted_best_k(a: float, c: float, relative: Sequence[float]) -> tuple[int, float]:
    """The k (0: plain decoding) the formula likes best on the measured curve, and its speedup."""
    best = (0, 1.0)
    for k in range(1, len(relative)):
        speedup = predicted_speedup(a, k, c, relative)
        if speedup > best[1]:
            best = (k, speedup)
    return best


@dataclass(frozen=True)
class TheoryRow:
    """Predicted against measured, for one tool at one fixed k and temperature."""

    config: BenchConfig
    alpha: float
    """judged_acceptance of the runs."""
    c: float
    """The cost of one guess the prediction used (CostCurve.guess_cost)."""
    predicted_tokens_per_pass: float
    measured_tokens_per_pass: float | None
    predicted_speedup: float
    measured_speedup: float | None
    """Median of the paired speedups."""


def theory_rows(
    summaries: Sequence[ConfigSummary], curve: CostCurve, draft_source: str = "model"
) -> list[TheoryRow]:
    rows = []
    for s in summaries:
        k = s.config.k
        if k is None or s.config.tree is not None:  # the chain's formula: chains only
            continue
        if s.judged_acceptance is None or k >= len(curve.relative):
            continue
        c = curve.guess_cost(s.config, draft_source)
        if c is None:
            continue
        rows.append(
            TheoryRow(
                config=s.config,
                alpha=s.judged_acceptance,
                c=c,
                predicted_tokens_per_pass=predicted_tokens_per_pass(s.judged_acceptance, k),
                measured_tokens_per_pass=s.tokens_per_pass,
                predicted_speedup=predicted_speedup(s.judged_acceptance, k, c, curve.relative),
                measured_speedup=s.speedup.median if s.speedup else None,
            )
        )
    return rows


@dataclass(frozen=True)
class BestK:
    """The best draft length, predicted and measured, for macspec at one temperature."""

    temperature: float
    alpha: float
    """Pooled over macspec's fixed-k runs: accepted / (accepted + rejections)."""
    predicted_k: int
    predicted_speedup: float
    measured_k: int | None
    """The fixed k with the highest median speedup; 0 when none beat plain decoding."""
    measured_speedup: float | None
    """Its median speedup (1.0 for plain decoding)."""


def best_k(
    summaries: Sequence[ConfigSummary], curve: CostCurve, draft_source: str = "model"
) -> list[BestK]:
    by_temp: dict[float, list[ConfigSummary]] = defaultdict(list)
    for s in summaries:
        chain = s.config.k is not None and s.config.tree is None
        if s.config.tool == MACSPEC and chain and s.config.source is None:
            by_temp[s.config.temperature].append(s)
    results = []
    for temp, group in by_temp.items():
        accepted = sum(s.accepted for s in group)
        alpha = ratio(accepted, accepted + sum(s.rejections for s in group))
        if alpha is None:
            continue
        c = curve.guess_cost(group[0].config, draft_source)
        if c is None:
            continue
        k, speedup = predicted_best_k(alpha, c, curve.relative)
        measured = [(s.speedup.median, s.config.k) for s in group if s.speedup]
        top = max(measured, default=None)
        if top is not None and top[0] <= 1:
            top = (1.0, 0)
        results.append(
            BestK(temp, alpha, k, speedup, top[1] if top else None, top[0] if top else None)
        )
    return results
