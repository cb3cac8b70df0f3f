"""Whether `macspec bench`'s greedy outputs are the target's own: each run checked token for
token against its references (pure functions over recorded runs, like bench/figures.py)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from macspec.bench.figures import MACSPEC, MLX_LM, BenchConfig, RunRecord


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first position where two id sequences differ (a length counts); None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


@dataclass(frozen=True)
class Comparison:
    """A greedy output checked token for token against a reference output of the same prompt."""

    config: BenchConfig
    reference: BenchConfig
    prompt: int
    repeat: int
    identical: bool
    position: int | None
    """First differing position (None when identical)."""
    got: int | None
    """The candidate's id there (None: it had ended)."""
    expected: int | None
    """The reference's id there (None: it had ended)."""
    lengths: tuple[int, int]
    """(candidate, reference) generated ids."""
    margin: float | None = None
    """The target's top-1 minus top-2 logit at the differing position, when measured: a
    small gap means a numerical near tie flipped an argmax."""


def compare(candidate: RunRecord, reference: RunRecord) -> Comparison:
    at = first_difference(candidate.tokens, reference.tokens)

    def token(tokens: tuple[int, ...]) -> int | None:
        return tokens[at] if at is not None and at < len(tokens) else None

    return Comparison(
        config=candidate.config,
        reference=reference.config,
        prompt=candidate.prompt,
        repeat=candidate.repeat,
        identical=at is None,
        position=at,
        got=token(candidate.tokens),
        expected=token(reference.tokens),
        lengths=(len(candidate.tokens), len(reference.tokens)),
    )


def lossless_checks(records: Sequence[RunRecord]) -> list[Comparison]:
    """At temperature 0, every macspec output against macspec plain and mlx-lm plain.

    macspec plain itself is checked against mlx-lm plain: the baseline must be the target's
    own greedy output too. mlx-lm speculative is checked against mlx-lm plain for reference.
    At T > 0, macspec's coupled runs (same seed per prompt) against macspec plain: with the
    coupled sampler they are the same tokens too.
    """
    runs = {(r.config, r.prompt, r.repeat): r for r in records}
    checks = []
    for (config, prompt, repeat), record in runs.items():
        if config.temperature == 0 or config.tool != MACSPEC or config.draft is None:
            continue
        if config.sampler is None:  # coupled
            plain = runs.get((BenchConfig(MACSPEC, None, config.temperature), prompt, repeat))
            if plain is not None:
                checks.append(compare(record, plain))
    greedy = {(r.config, r.prompt, r.repeat): r for r in records if r.config.temperature == 0}
    ours_plain, mlx_plain = BenchConfig(MACSPEC, None, 0.0), BenchConfig(MLX_LM, None, 0.0)
    for (config, prompt, repeat), record in greedy.items():
        if config.tool == MACSPEC and config.draft is not None:
            references = [ours_plain, mlx_plain]
        elif config == ours_plain or (config.tool == MLX_LM and config.draft is not None):
            references = [mlx_plain]
        else:
            continue
        for reference in references:
            other = greedy.get((reference, prompt, repeat))
            if other is not None:
                checks.append(compare(record, other))
    return checks


@dataclass(frozen=True)
class LosslessSummary:
    """Checks of one configuration against one reference."""

    config: BenchConfig
    reference: BenchConfig
    checked: int
    identical: int
    differences: list[Comparison] = field(default_factory=list)


def summarize_lossless(checks: Sequence[Comparison]) -> list[LosslessSummary]:
    grouped: dict[tuple[BenchConfig, BenchConfig], list[Comparison]] = defaultdict(list)
    for check in checks:
        grouped[(check.config, check.reference)].append(check)
    return [
        LosslessSummary(
            config,
            reference,
            len(group),
            sum(c.identical for c in group),
            [c for c in group if not c.identical],
        )
        for (config, reference), group in grouped.items()
    ]
