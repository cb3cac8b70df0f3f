"""A finished benchmark as figures: the summaries, the JSON document, the optional plot.

Everything is computed from the BenchResult by the pure functions of bench.py and
bench_theory.py; the CLI only renders what `report` returns.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from macspec.bench.figures import (
    BenchConfig,
    ConfigSummary,
    RunRecord,
    Spread,
    summarize,
)
from macspec.bench.lossless import LosslessSummary, summarize_lossless
from macspec.bench.theory import (
    BestK,
    TheoryRow,
    best_k,
    theory_rows,
)
from macspec.errors import MacspecError

if TYPE_CHECKING:
    from macspec.bench.runner import BenchResult
from macspec.bench.prompts import BenchPrompt

HOW_COUNTED = {
    "decode_tokens_per_s": (
        "per run, ids after the first target pass over the seconds from the end of that pass "
        "to the last id, timed from outside the tool; the median over prompts and repeats"
    ),
    "speedup": (
        "per prompt and repeat, the decode rate over macspec plain's on the same prompt and "
        "repeat at the same temperature (runs interleaved); the median of those ratios"
    ),
    "acceptance_rate": "accepted guesses / proposed guesses, pooled over runs",
    "judged_acceptance": (
        "accepted / (accepted + cycles ending on a rejection): the chance a guess the target "
        "judged is kept (guesses after a rejection are never judged), the a of the formula"
    ),
    "tokens_per_pass": "generated ids (end of sequence excluded) / target passes, pooled",
    "mlx_lm_proposals": (
        "mlx-lm does not report proposals; they are replayed from its from_draft flags: each "
        "cycle drafts min(k, max_tokens - generated) ids and ends at the first id not from the "
        "draft (or at max_tokens)"
    ),
    "predicted_speedup": (
        "(1 - a^(k+1)) / ((1 - a) (k c + T(k+1)/T(1))); c: one guess's seconds over a target "
        "pass of one id (a draft model step; for --draft lookup, the index lookup per id; a "
        "hybrid is priced as its model)"
    ),
    "ttft_s": "seconds from the call to the first generated id, prompt processing included",
    "peak_memory_bytes": "mx.get_peak_memory(), reset before each run; the largest run",
}


@dataclass(frozen=True)
class Report:
    """The figures of one benchmark, ready to render."""

    result: BenchResult
    prompts: list[BenchPrompt]
    summaries: list[ConfigSummary]
    lossless: list[LosslessSummary]
    theory: list[TheoryRow]
    best: list[BestK]
    models: dict[str, Any]
    """Names and folders of the target and draft."""

    @property
    def temperatures(self) -> list[float]:
        return list(dict.fromkeys(s.config.temperature for s in self.summaries))

    def at(self, temperature: float) -> list[ConfigSummary]:
        return [s for s in self.summaries if s.config.temperature == temperature]


def report(result: BenchResult, prompts: list[BenchPrompt], models: dict[str, Any]) -> Report:
    summaries = summarize(result.records)
    curve = result.curve
    return Report(
        result=result,
        prompts=prompts,
        summaries=summaries,
        lossless=summarize_lossless(result.checks),
        theory=theory_rows(summaries, curve, result.settings.draft_source) if curve else [],
        best=best_k(summaries, curve, result.settings.draft_source) if curve else [],
        models=models,
    )


# -- JSON -----------------------------------------------------------------------------------


def _config(config: BenchConfig) -> dict[str, Any]:
    return {
        "label": config.label,
        "name": config.name,
        "tool": config.tool,
        "draft": config.draft,
        "k": config.k,
        "tree": config.tree,
        "temperature": config.temperature,
    }


def _spread(value: Spread | None) -> dict[str, float] | None:
    return asdict(value) if value is not None else None


def _run(record: RunRecord) -> dict[str, Any]:
    return {
        "config": record.config.label,
        "prompt": record.prompt,
        "repeat": record.repeat,
        "generated_tokens": len(record.tokens),
        "finish_reason": record.finish_reason,
        "ttft_s": record.ttft_s,
        "decode_tokens_per_s": record.decode_tokens_per_s,
        "elapsed_s": record.elapsed_s,
        "first_pass_tokens": record.first_pass_tokens,
        "passes": record.passes,
        "proposed": record.proposed,
        "accepted": record.accepted,
        "rejections": record.rejections,
        "wasted": record.wasted,
        "peak_memory_bytes": record.peak_memory_bytes,
        "fed": record.fed,
        "refed": record.refed,
        "waits": record.waits,
        "tokens": list(record.tokens),
    }


def to_json(rep: Report) -> dict[str, Any]:
    """Every figure of the benchmark, as one JSON-ready document."""
    result, curve = rep.result, rep.result.curve
    configs = []
    for s in rep.summaries:
        entry = {key: value for key, value in asdict(s).items() if key != "config"}
        entry.update(
            config=_config(s.config),
            decode_tokens_per_s=_spread(s.decode_tokens_per_s),
            speedup=_spread(s.speedup),
            ttft_s=_spread(s.ttft_s),
        )
        configs.append(entry)
    lossless = []
    for group in rep.lossless:
        lossless.append(
            {
                "config": group.config.label,
                "reference": group.reference.label,
                "checked": group.checked,
                "identical": group.identical,
                "lossless": group.identical == group.checked,
            }
        )
    checks = []
    for c in result.checks:
        entry = {
            key: value for key, value in asdict(c).items() if key not in ("config", "reference")
        }
        entry.update(
            config=c.config.label,
            reference=c.reference.label,
            prompt_name=rep.prompts[c.prompt].name,
            lengths=list(c.lengths),
        )
        checks.append(entry)
    return {
        "models": rep.models,
        "settings": asdict(result.settings),
        "seconds": result.seconds,
        "prompts": [
            {**asdict(p), "prompt_tokens": len(ids)}
            for p, ids in zip(rep.prompts, result.prompt_ids)
        ],
        "configs": configs,
        "lossless": lossless,
        "checks": checks,
        "cost_curve": None
        if curve is None
        else {
            "target_s": list(curve.target_s),
            "relative": list(curve.relative),
            "draft_s": curve.draft_s,
            "draft_cost": curve.draft_cost,
            "lookup_s": curve.lookup_s,
            "lookup_cost": curve.lookup_cost,
        },
        "theory": [{**asdict(t), "config": t.config.label} for t in rep.theory],
        "best_k": [asdict(b) for b in rep.best],
        "runs": [_run(r) for r in result.records],
        "how_counted": HOW_COUNTED,
    }


# -- the plot -------------------------------------------------------------------------------


def require_matplotlib() -> None:
    """Fail before a long run, not after it, when --plot cannot be drawn."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise MacspecError(
            "--plot needs matplotlib: pip install 'macspec[plot]' (or pip install matplotlib)"
        ) from None


def plot(rep: Report, path: Path) -> None:
    """Speedup per configuration (median, quartiles as error bars) and the verify-cost curve."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    temps = rep.temperatures
    fig, axes = plt.subplots(1, len(temps) + 1, figsize=(5 * (len(temps) + 1), 4.5))
    for ax, temp in zip(axes, temps):
        rows = [s for s in rep.at(temp) if s.speedup is not None]
        medians = [s.speedup.median for s in rows]
        errors = [
            [m - s.speedup.q1 for m, s in zip(medians, rows)],
            [s.speedup.q3 - m for m, s in zip(medians, rows)],
        ]
        colors = ["tab:blue" if s.config.tool == "macspec" else "tab:orange" for s in rows]
        ax.barh([s.config.name for s in rows], medians, xerr=errors, color=colors)
        ax.axvline(1.0, color="grey", linewidth=1)
        ax.invert_yaxis()
        ax.set_title(f"decode speedup over macspec plain, T={temp:g}")
        ax.set_xlabel("speedup (median, IQR)")
    curve = rep.result.curve
    if curve is not None:
        ax = axes[-1]
        ms = list(range(1, len(curve.relative) + 1))
        ax.plot(ms, curve.relative, marker="o", label="target T(m)/T(1), measured")
        ax.plot(ms, ms, linestyle="--", color="grey", label="T(m) = m T(1)")
        ax.axhline(1.0, linestyle=":", color="grey", label="T(m) = T(1)")
        ax.set_title(f"verify cost (draft step c = {curve.draft_cost:.2f})")
        ax.set_xlabel("ids in one target pass (m)")
        ax.legend()
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=120)
    except OSError as exc:
        raise MacspecError(f"--plot {path}: cannot write it ({exc.strerror or exc})") from None
    finally:
        plt.close(fig)
