"""The figures of `macspec bench`: pure functions over recorded runs, no models, no clocks.

A run is recorded from the outside, the same way for every tool (macspec/bench_run.py does
the recording): the ids it generated, when each arrived, and its cycle counts. Everything
the report shows is computed here from those records, so tests can check the arithmetic.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

MACSPEC, MLX_LM = "macspec", "mlx-lm"


@dataclass(frozen=True)
class BenchConfig:
    """One way of decoding that the benchmark compares."""

    tool: str
    """'macspec' (our engine) or 'mlx-lm' (its stream_generate)."""
    draft: str | None
    """None: plain decoding of the target; a number 'k': k guesses per cycle; 'auto' (a
    fresh adaptive policy per run, as `macspec run` has); 'auto-warm' (one adaptive policy
    kept across the runs, as a chat session keeps its engine's)."""
    temperature: float
    """Sampling temperature; 0 is greedy."""
    source: str | None = None
    """macspec's drafter when it is not the benchmark's first (`--draft model,mtp`): 'mtp',
    'dflash', 'lookup', ...; None for the first, and for mlx-lm."""
    sampler: str | None = None
    """macspec at T > 0: None is the coupled sampler (seeded: tokens identical to plain
    decoding's), 'rejection' the rejection rule, run beside it to compare acceptance."""
    tree: str | None = None
    """macspec verifying draft trees (`--draft-tree`): at most this many nodes per pass, or
    'auto'; None: chains."""

    @property
    def k(self) -> int | None:
        """The fixed draft length, or None for plain decoding and 'auto'."""
        return int(self.draft) if self.draft is not None and self.draft.isdigit() else None

    @property
    def name(self) -> str:
        """'macspec plain', 'mlx-lm k=3', 'macspec auto': the row label, temperature aside."""
        if self.draft is None:
            return f"{self.tool} plain"
        # macspec's rows at T > 0 are coupled; its rejection-rule rows are named by the rule
        tool = self.sampler or (f"{self.tool} {self.source}" if self.source else self.tool)
        tree = {None: "", "auto": " tree"}.get(self.tree, f" tree {self.tree}")
        return f"{tool} {self.draft if self.k is None else f'k={self.k}'}{tree}"

    @property
    def label(self) -> str:
        """The name with its temperature: unique within one benchmark."""
        return f"{self.name} T={self.temperature:g}"


def baseline_of(config: BenchConfig) -> BenchConfig:
    """What a configuration's speedup is measured against: macspec plain at its temperature."""
    return BenchConfig(MACSPEC, None, config.temperature)


@dataclass(frozen=True)
class RunRecord:
    """One generation of one prompt by one configuration, as seen from the outside."""

    config: BenchConfig
    """How it decoded."""
    prompt: int
    """Index of the prompt in the benchmark's prompt set."""
    repeat: int
    """Which repetition of the prompt set (0-based)."""
    tokens: tuple[int, ...]
    """Generated ids, end-of-sequence excluded."""
    finish_reason: str
    """'stop' (end of sequence) or 'length' (max tokens)."""
    arrivals: tuple[float, ...]
    """Seconds from the call to the arrival of each generated id."""
    elapsed_s: float
    """Seconds from the call until the generation was over."""
    first_pass_tokens: int
    """Ids the first target pass delivered (decode timing starts after them)."""
    passes: int
    """Target forward passes after the prompt: one per cycle."""
    proposed: int
    """Draft guesses sent to the target."""
    accepted: int
    """Guesses the target kept."""
    rejections: int
    """Cycles that ended on a rejected guess (the guesses after it were never judged)."""
    peak_memory_bytes: int = 0
    """mx.get_peak_memory() over this run."""
    fed: int = 0
    """Ids the target's passes processed after the prompt (macspec only)."""
    refed: int = 0
    """Of those, ids fed again after a checkpoint was restored: what rolling back recurrent or
    wrapped sliding-window caches costs (macspec only; 0 for attention-only targets)."""
    waits: int = 0
    """Blocking host-device waits after the first target pass (bench/waits.py), so the
    prompt's prefill does not count: each idles an Apple GPU."""

    @property
    def ttft_s(self) -> float | None:
        """Seconds to the first generated id, prompt processing included."""
        return self.arrivals[0] if self.arrivals else None

    @property
    def decode_tokens_per_s(self) -> float | None:
        """Ids after the first pass over the time after it.

        Starting the clock at the end of the first pass (not at the first id) keeps a
        speculative first pass, which delivers several ids at once, from counting as free.
        """
        first = min(self.first_pass_tokens, len(self.arrivals))
        if first < 1 or len(self.arrivals) <= first:
            return None
        span = self.arrivals[-1] - self.arrivals[first - 1]
        return (len(self.arrivals) - first) / span if span > 0 else None

    @property
    def wasted(self) -> int:
        """Guesses drafted for nothing: proposed minus accepted."""
        return self.proposed - self.accepted


@dataclass(frozen=True)
class MlxCycles:
    """mlx-lm's speculative cycles, replayed from its `from_draft` flags."""

    passes: int
    proposed: int
    accepted: int
    rejections: int
    first_pass_tokens: int


def replay_mlx_cycles(
    from_draft: Sequence[bool], k: int, max_tokens: int, delivered: int
) -> MlxCycles:
    """Count what mlx-lm's speculative_generate_step proposed, from the flags it yielded.

    Its rule (mlx_lm/generate.py): each cycle drafts min(k, max_tokens - generated) ids,
    yields the accepted ones (from_draft True), then one target id (from_draft False), which
    ends the cycle; a cycle cut by max_tokens ends without it. `from_draft` holds a flag for
    every id it yielded, the end-of-sequence id included; `delivered` counts ids without it.
    k = 0 replays plain decoding: one pass per id.
    """
    passes = proposed = accepted = rejections = 0
    first_pass = None
    generated = 0
    i = 0
    while i < len(from_draft):
        passes += 1
        guesses = min(k, max_tokens - generated)
        proposed += guesses
        kept = 0
        while i < len(from_draft) and from_draft[i]:
            kept, i, generated = kept + 1, i + 1, generated + 1
        accepted += kept
        if i < len(from_draft):  # the target's own id closes the cycle
            i, generated = i + 1, generated + 1
            rejections += kept < guesses
        if first_pass is None:
            first_pass = min(generated, delivered)
    return MlxCycles(passes, proposed, accepted, rejections, first_pass or 0)


# -- statistics -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Spread:
    """A median with its spread."""

    median: float
    q1: float
    """First quartile (inclusive method; equals the median for a single value)."""
    q3: float
    """Third quartile."""
    low: float
    high: float
    count: int


def spread(values: Iterable[float | None]) -> Spread | None:
    """Median, quartiles and range of the values that are not None; None when there are none."""
    data = sorted(v for v in values if v is not None)
    if not data:
        return None
    if len(data) == 1:
        q1 = q3 = data[0]
    else:
        q1, _, q3 = statistics.quantiles(data, n=4, method="inclusive")
    return Spread(statistics.median(data), q1, q3, data[0], data[-1], len(data))


def ratio(part: int | float, whole: int | float) -> float | None:
    return part / whole if whole else None


# -- per configuration ------------------------------------------------------------------------


@dataclass(frozen=True)
class ConfigSummary:
    """Every figure of one configuration, over all its prompts and repeats."""

    config: BenchConfig
    runs: int
    generated_tokens: int
    """Ids over all runs."""
    decode_tokens_per_s: Spread | None
    """Per run decode rate (see RunRecord.decode_tokens_per_s)."""
    speedup: Spread | None
    """Per (prompt, repeat): this decode rate over the baseline's on the same prompt and repeat.
    Paired, so drift of the machine between prompts cancels."""
    speedup_of_medians: float | None
    """Median decode rate over the baseline's median decode rate."""
    ttft_s: Spread | None
    passes: int
    proposed: int
    accepted: int
    rejections: int
    acceptance_rate: float | None
    """accepted / proposed, pooled over runs."""
    judged_acceptance: float | None
    """accepted / (accepted + rejections): the chance a guess is kept, per guess the target
    judged (Leviathan's alpha); what the theory's formula takes."""
    tokens_per_pass: float | None
    """Generated ids / target passes, pooled."""
    wasted: int
    """Guesses drafted for nothing: proposed - accepted."""
    draft_length: float | None
    """Mean guesses per cycle (proposed / passes): k, or what 'auto' settled on."""
    peak_memory_bytes: int
    """The largest per run peak."""
    refed: int = 0
    """Ids fed again after checkpoint restores, over all runs."""
    refed_share: float | None = None
    """refed over all ids the target's passes processed: the verify work restores added."""
    waits_per_pass: float | None = None
    """Blocking host-device waits per target pass (per cycle): 1 is the least a step needs."""


def summarize(records: Sequence[RunRecord]) -> list[ConfigSummary]:
    """One summary per configuration, in the order configurations first appear."""
    by_config: dict[BenchConfig, list[RunRecord]] = defaultdict(list)
    for record in records:
        by_config[record.config].append(record)
    rates = {(r.config, r.prompt, r.repeat): r.decode_tokens_per_s for r in records}
    summaries = []
    for config, runs in by_config.items():
        base = baseline_of(config)
        paired = []
        for run in runs:
            mine, theirs = run.decode_tokens_per_s, rates.get((base, run.prompt, run.repeat))
            paired.append(mine / theirs if mine and theirs else None)
        decode = spread(r.decode_tokens_per_s for r in runs)
        base_decode = spread(r.decode_tokens_per_s for r in by_config.get(base, []))
        passes = sum(r.passes for r in runs)
        proposed = sum(r.proposed for r in runs)
        accepted = sum(r.accepted for r in runs)
        rejections = sum(r.rejections for r in runs)
        generated = sum(len(r.tokens) for r in runs)
        summaries.append(
            ConfigSummary(
                config=config,
                runs=len(runs),
                generated_tokens=generated,
                decode_tokens_per_s=decode,
                speedup=spread(paired) if base in by_config else None,
                speedup_of_medians=(
                    decode.median / base_decode.median if decode and base_decode else None
                ),
                ttft_s=spread(r.ttft_s for r in runs),
                passes=passes,
                proposed=proposed,
                accepted=accepted,
                rejections=rejections,
                acceptance_rate=ratio(accepted, proposed),
                judged_acceptance=ratio(accepted, accepted + rejections),
                tokens_per_pass=ratio(generated, passes),
                wasted=proposed - accepted,
                draft_length=ratio(proposed, passes),
                peak_memory_bytes=max(r.peak_memory_bytes for r in runs),
                refed=sum(r.refed for r in runs),
                refed_share=ratio(sum(r.refed for r in runs), sum(r.fed for r in runs)),
                waits_per_pass=ratio(sum(r.waits for r in runs), passes - len(runs)),
            )
        )
    return summaries
