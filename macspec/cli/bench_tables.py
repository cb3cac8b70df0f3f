"""The tables and summary lines of `macspec bench`: only rendering, from a Report."""

from __future__ import annotations

import textwrap

from rich import box
from rich.console import Console
from rich.table import Table

from macspec.bench.figures import MACSPEC, ConfigSummary, Spread
from macspec.bench.lossless import LosslessSummary
from macspec.bench.report import HOW_COUNTED, Report
from macspec.text import counted

SHARDED_NOTE = (
    "mlx-lm's rows are left out: its decoding does not run on a target sharded over ranks; "
    "speedups are over macspec plain decoding on the same sharded target."
)
NEAR_TIE = 0.05
"""A top-1/top-2 logit gap below this is called a near tie: rounding can flip such an argmax."""


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _num(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _with_iqr(value: Spread | None, digits: int, unit: str = "") -> str:
    """The median and, below it when there is a spread, its quartiles: '1.10–1.31'."""
    if value is None:
        return "-"
    text = f"{value.median:.{digits}f}{unit}"
    if value.count > 1:
        text += f"\n[dim]{value.q1:.{digits}f}–{value.q3:.{digits}f}[/]"
    return text


def config_table(rows: list[ConfigSummary], temperature: float) -> Table:
    table = Table(
        title=f"decoding at T={temperature:g} (median, IQR)",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        collapse_padding=True,
        pad_edge=False,
    )
    table.add_column("config", no_wrap=True)
    for name in (
        "tok/s",
        "speedup",
        "accept",
        "tok/\npass",
        "k",
        "wait/\npass",
        "TTFT\nms",
        "peak\nMB",
    ):
        table.add_column(name, justify="right", no_wrap=True)
    refeeds = any(s.refed for s in rows)  # a target that rolls back by restoring checkpoints
    if refeeds:
        table.add_column("re-\nfed", justify="right", no_wrap=True)
    for s in rows:
        refed = [_share(s.refed_share) if s.config.tool == "macspec" else "-"] if refeeds else []
        table.add_row(
            s.config.name,
            _with_iqr(s.decode_tokens_per_s, 1),
            _with_iqr(s.speedup, 2, "x"),
            _share(s.acceptance_rate),
            _num(s.tokens_per_pass),
            _num(s.draft_length, 1) if s.config.draft else "-",
            _num(s.waits_per_pass),
            "-" if s.ttft_s is None else f"{s.ttft_s.median * 1000:.0f}",
            f"{s.peak_memory_bytes / 1e6:.0f}",
            *refed,
        )
    if refeeds:
        table.caption = (
            "re-fed: share of the ids verify passes processed that were fed again after a "
            "checkpoint restore (recurrent and sliding-window caches roll back that way)"
        )
        table.caption_justify = "left"
    return table


def _difference(rep: Report, d) -> str:
    got = "end" if d.got is None else str(d.got)
    expected = "end" if d.expected is None else str(d.expected)
    text = f"{rep.prompts[d.prompt].name}#{d.repeat + 1} @{d.position}: {got} vs {expected}"
    if d.margin is not None:
        text += f" (gap {d.margin:.3g}{', near tie' if d.margin < NEAR_TIE else ''})"
    return text


def lossless_table(rep: Report, groups: list[LosslessSummary]) -> Table:
    table = Table(
        title="lossless: identical ids, prompt by prompt (T>0: coupled, same seed)",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        collapse_padding=True,
        pad_edge=False,
    )
    for name in ("config", "against", "identical", "first differences"):
        table.add_column(name, no_wrap=name != "first differences")
    for g in groups:
        verdict = f"{g.identical}/{g.checked}"
        style = "green" if g.identical == g.checked else "bold red"
        shown = [_difference(rep, d) for d in g.differences[:4]]
        if len(g.differences) > 4:
            shown.append(f"... {len(g.differences) - 4} more (see --json)")
        table.add_row(
            g.config.label, g.reference.label, f"[{style}]{verdict}[/]", "; ".join(shown) or "-"
        )
    table.caption = (
        "first differences: prompt#repeat @position: id vs reference id; gap: the target's "
        f"top-1 minus top-2 logit there (< {NEAR_TIE}: a near tie rounding can flip)"
    )
    table.caption_justify = "left"
    return table


def curve_table(rep: Report, per_row: int = 8) -> Table:
    """T(m)/T(1) and ms per m, in bands of `per_row` m so it fits an 80-column terminal."""
    curve, ranks = rep.result.curve, rep.result.settings.ranks
    where = f"over {ranks} ranks" if ranks > 1 else "on this device"
    table = Table(
        title=f"verify cost {where}: a target pass over m ids",
        title_justify="left",
        box=box.SIMPLE,
        show_header=False,
        pad_edge=False,
    )
    for _ in range(per_row + 1):
        table.add_column(justify="right")
    n = len(curve.relative)
    for start in range(0, n, per_row):
        band = range(start, min(n, start + per_row))
        table.add_row("m", *[f"[bold]{m + 1}[/]" for m in band])
        table.add_row("T(m)/T(1)", *[f"{curve.relative[m]:.2f}" for m in band])
        table.add_row("ms", *[f"{curve.target_s[m] * 1000:.1f}" for m in band], end_section=True)
    table.caption = (
        (
            f"draft step: {curve.draft_s * 1000:.2f} ms, c = {curve.draft_cost:.2f} of a target "
            "pass; "
            if curve.draft_s is not None
            else "no draft model to time; "
        )
        + f"prompt lookup: {curve.lookup_s * 1e6:.1f} us per guessed id, "
        f"c = {curve.lookup_cost:.4f}. "
        "T(m)/T(1) is about m on a CPU, about 1 up to ~8 ids on Apple GPUs."
    )
    table.caption_justify = "left"
    return table


def theory_table(rep: Report) -> Table:
    table = Table(
        title="theory against measurement",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        collapse_padding=True,
        pad_edge=False,
    )
    for name in (
        "config",
        "T",
        "a",
        "c",
        "tok/pass predicted",
        "measured",
        "speedup predicted",
        "measured ",
    ):
        table.add_column(name, justify="left" if name == "config" else "right")
    for t in rep.theory:
        table.add_row(
            t.config.name,
            f"{t.config.temperature:g}",
            _num(t.alpha),
            f"{t.c:.3g}",
            _num(t.predicted_tokens_per_pass),
            _num(t.measured_tokens_per_pass),
            _num(t.predicted_speedup) + "x",
            _num(t.measured_speedup) + "x",
        )
    lines = [HOW_COUNTED["predicted_speedup"] + "; a = " + HOW_COUNTED["judged_acceptance"]]
    for b in rep.best:
        rows = [r for r in rep.at(b.temperature) if r.config.draft and r.speedup is not None]
        top = max(rows, key=lambda r: r.speedup.median, default=None)
        shown = round(b.measured_speedup or 1.0, 2)  # as printed: a tie is no difference
        higher = top is not None and round(top.speedup.median, 2) > shown
        best = "plain decoding" if b.predicted_k == 0 else f"k={b.predicted_k}"
        seen = (
            "-"
            if b.measured_k is None
            else ("plain decoding" if b.measured_k == 0 else f"k={b.measured_k}")
        )
        lines.append(
            f"T={b.temperature:g}: with a={b.alpha:.2f} the best is {best} "
            f"({b.predicted_speedup:.2f}x predicted); measured best: {seen} "
            f"({_num(b.measured_speedup)}x)"
            + (f"; {_why_not_best(top, fixed_k=True)}" if higher else "")
        )
    table.caption = "\n".join(lines)
    table.caption_justify = "left"
    return table


def render(rep: Report, console: Console) -> None:
    result = rep.result
    s = result.settings
    console.print(
        f"[bold]macspec bench[/]: {rep.models['target']} with draft {rep.models['draft']}"
        f" (macspec drafts by {', '.join((s.draft_source, *s.more_sources))}); "
        f"{counted(len(rep.prompts), 'prompt')} x {counted(s.repeats, 'repeat')}, "
        f"max {s.max_tokens} tokens, "
        f"T=0 and T={s.temperature:g}; {result.seconds:.0f} s"
        + (f"; the target sharded over {s.ranks} ranks" if s.ranks > 1 else ""),
        highlight=False,
    )
    for temp in rep.temperatures:
        console.print(config_table(rep.at(temp), temp))
    console.print(
        "tok/s: "
        + HOW_COUNTED["decode_tokens_per_s"]
        + ". speedup: "
        + HOW_COUNTED["speedup"]
        + ". mlx-lm's proposals: "
        + HOW_COUNTED["mlx_lm_proposals"]
        + ". At T>0 mlx-lm keeps a guess only when its own sample equals the draft's, so its "
        "acceptance is lower than rejection sampling's.",
        style="dim",
        highlight=False,
    )
    if s.ranks > 1:
        console.print(SHARDED_NOTE, style="dim", highlight=False)
    elif not any(c.tool == "mlx-lm" and c.draft for c in result.configs):
        console.print(
            "mlx-lm refuses to speculate on this pair (a cache it cannot trim: hybrid, "
            "recurrent or sliding-window layers), so only its plain decoding runs.",
            style="dim",
            highlight=False,
        )
    console.print(lossless_table(rep, rep.lossless))
    if result.curve is not None:
        console.print(curve_table(rep))
        console.print(theory_table(rep))


def beats_plain(speedup: Spread) -> bool:
    """By 5% at the median and on about three prompts in four (the first quartile above 1;
    every prompt when there are fewer than four): else timing noise could have decided it."""
    steady = speedup.q1 if speedup.count >= 4 else speedup.low
    return speedup.median > 1.05 and steady > 1.0


def _unsteady(speedup: Spread) -> str:
    """How a speedup fails to be steady: its first quartile (the slowest prompt when fewer
    than four) at or below plain decoding's."""
    if speedup.count >= 4:
        return f"first quartile {speedup.q1:.2f}x"
    return f"slowest prompt {speedup.low:.2f}x"


def _why_not_best(row: ConfigSummary, fixed_k: bool = False) -> str:
    """Why a row with a higher median than the verdict's is not the verdict: 'macspec auto's
    1.92x median is not steady: first quartile 0.61x' (and, for the theory's comparison of
    fixed draft lengths, that it is not one)."""
    reasons = []
    if fixed_k and (row.config.tool != MACSPEC or row.config.k is None or row.config.source):
        reasons.append("is not one of macspec's fixed k")
    if not beats_plain(row.speedup):
        reasons.append(f"is not steady: {_unsteady(row.speedup)}")
    return f"{row.config.name}'s {row.speedup.median:.2f}x median " + ", and ".join(reasons)


def speed_verdict(rows: list[ConfigSummary]) -> str:
    """The fastest configuration that really beats plain decoding, or why none is called so;
    and why not a row whose median is higher."""
    winners = [r for r in rows if beats_plain(r.speedup)]
    best = max(winners or rows, key=lambda r: r.speedup.median)
    if not winners and best.speedup.median <= 1.05:
        return "nothing beats plain decoding by 5% here: guessing does not pay"
    name, s = best.config.name, best.speedup
    quartiles = f"quartiles {s.q1:.2f}-{s.q3:.2f}"
    if not winners:
        return f"{name} {s.median:.2f}x plain, but not steadily ({quartiles})"
    verdict = f"{name} is fastest: {s.median:.2f}x plain ({quartiles})"
    top = max(rows, key=lambda r: r.speedup.median)
    if top.speedup.median > s.median:
        verdict += f"; {_why_not_best(top)}"
    return verdict


def summary_lines(rep: Report) -> list[str]:
    """--quick without --verbose: the verdict, the speedups, the losslessness, in a few lines
    of at most 80 columns."""
    result = rep.result
    s = result.settings
    # A no-break space: the wrap below never leaves "s" alone on a line of its own.
    lines = [
        f"macspec bench --quick: {rep.models['target']} + {rep.models['draft']}; "
        f"{len(rep.prompts)} prompts, {s.max_tokens} tokens; {result.seconds:.0f}\u00a0s"
    ]
    if s.ranks > 1:
        lines += sharded_lines(rep)
    for temp in rep.temperatures:
        rows = [r for r in rep.at(temp) if r.config.draft is not None and r.speedup is not None]
        if not rows:
            continue
        lines.append(f"T={temp:g}: {speed_verdict(rows)}")
        speedups = ", ".join(f"{r.config.name} {_with_quartiles(r.speedup)}" for r in rows)
        spread = " (quartiles)" if any(r.speedup.count > 1 for r in rows) else ""
        lines.append(f"speedup over plain: {speedups}: median{spread} over the prompts")
    checked = sum(g.checked for g in rep.lossless)
    identical = sum(g.identical for g in rep.lossless)
    verdict = "lossless" if checked and identical == checked else "NOT LOSSLESS"
    lines.append(
        f"{verdict}: {identical} of {checked} answers identical to their reference "
        "(greedy: plain decoding; T>0: plain decoding with the same seed)"
    )
    lines.append("every table: --verbose; every figure: --json")
    # Not at hyphens: a quartile range such as (0.88-0.95) stays on one line.
    wrap = textwrap.TextWrapper(80, subsequent_indent="  ", break_on_hyphens=False)
    return [part for line in lines for part in wrap.wrap(line)]


def _with_quartiles(speedup: Spread) -> str:
    """'1.05x (0.61-1.30)': the median and, beside it, its quartiles over the prompts (a busy
    machine swings a short run's figures; this shows by how much)."""
    if speedup.count < 2:
        return f"{speedup.median:.2f}x"
    return f"{speedup.median:.2f}x ({speedup.q1:.2f}-{speedup.q3:.2f})"


def sharded_lines(rep: Report) -> list[str]:
    """On a target sharded over ranks: the cost of a pass per m ids and tokens per pass."""
    result = rep.result
    lines = [f"target sharded over {result.settings.ranks} ranks (mlx.distributed); {SHARDED_NOTE}"]
    curve = result.curve
    if curve is not None:
        shown = range(min(8, len(curve.target_s)))
        lines.append(
            f"pass over m ids, ms (m=1..{len(shown)}): "
            + " ".join(f"{curve.target_s[m] * 1000:.1f}" for m in shown)
        )
        lines.append("T(m)/T(1): " + " ".join(f"{curve.relative[m]:.2f}" for m in shown))
    rows = [r for r in rep.at(0.0) if r.config.draft is not None and r.tokens_per_pass]
    if rows:
        lines.append(
            "tokens per pass at T=0: "
            + ", ".join(f"{r.config.name} {r.tokens_per_pass:.2f}" for r in rows)
        )
    return lines
