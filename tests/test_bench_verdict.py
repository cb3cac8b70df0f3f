"""`macspec bench`'s verdict line and the theory table's caption: a speedup is claimed only
where most prompts show it, and a higher median that is passed over is named with the reason."""

from __future__ import annotations

from macspec.bench.figures import MACSPEC, BenchConfig


def test_the_quick_verdict_calls_a_speedup_only_when_most_prompts_show_it():
    from types import SimpleNamespace

    from macspec.bench.figures import spread
    from macspec.cli.bench_tables import speed_verdict

    def row(name, speedups):
        return SimpleNamespace(config=SimpleNamespace(name=name), speedup=spread(speedups))

    steady = row("macspec k=4", [1.3, 1.25, 1.2, 1.35])
    assert speed_verdict([steady]).startswith("macspec k=4 is fastest: 1.27x")
    # One lucky prompt lifts the median past 5%; most prompts were slower: no speedup claimed.
    noisy = row("macspec auto", [0.85, 0.9, 1.5, 1.6])
    assert "is fastest" not in speed_verdict([noisy])
    assert "macspec auto 1.20x plain, but not steadily" in speed_verdict([noisy])
    # The steady one is called fastest even when a noisy one has the higher median.
    assert speed_verdict([noisy, steady]).startswith("macspec k=4 is fastest")
    # With fewer than four prompts, every one of them must be faster.
    assert "is fastest" not in speed_verdict([row("macspec k=2", [0.95, 1.3])])
    assert "is fastest" in speed_verdict([row("macspec k=2", [1.1, 1.3])])
    assert "guessing does not pay" in speed_verdict([row("x", [0.86, 1.0, 1.04])])


def test_a_verdict_that_is_not_the_tables_best_median_says_why():
    """A row of the table with a higher median than the verdict's pick is named with the
    reason it was passed over: its first quartile (and, for the theory's measured best, that
    it is no fixed draft length), so '1.92x' in the table and 'plain decoding' below it agree."""
    from types import SimpleNamespace

    from macspec.bench.figures import spread
    from macspec.bench.theory import BestK
    from macspec.cli.bench_tables import speed_verdict, theory_table

    def row(draft, speedups, tool=MACSPEC):
        config = BenchConfig(tool, draft, 0.7)
        return SimpleNamespace(config=config, speedup=spread(speedups))

    lucky_auto = row("auto", [0.6, 0.6, 3.2, 3.2])  # median 1.90x, most prompts slower
    fixed = row("3", [0.8, 0.9, 0.95, 1.0])
    best = BestK(0.7, 0.5, 2, 1.3, 0, 1.0)  # measured best: plain decoding
    rep = SimpleNamespace(theory=[], best=[best], at=lambda temperature: [fixed, lucky_auto])
    caption = str(theory_table(rep).caption)
    assert "measured best: plain decoding (1.00x); macspec auto's 1.90x median is not one of " \
        "macspec's fixed k, and is not steady: first quartile 0.60x" in caption  # fmt: skip
    steady = row("3", [1.2, 1.25, 1.3, 1.35])
    assert speed_verdict([steady, lucky_auto]) == (
        "macspec k=3 is fastest: 1.27x plain (quartiles 1.24-1.31); macspec auto's 1.90x "
        "median is not steady: first quartile 0.60x"
    )
    # Where the verdict is the table's best median, there is nothing to explain.
    assert ";" not in speed_verdict([steady, fixed])
    best = BestK(0.7, 0.5, 2, 1.3, 3, steady.speedup.median)
    rep = SimpleNamespace(theory=[], best=[best], at=lambda temperature: [steady])
    assert str(theory_table(rep).caption).endswith("measured best: k=3 (1.27x)")
