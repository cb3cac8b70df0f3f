"""macspec's per-cycle overhead against mlx-lm's, on the same prompts and models (issue 2).

    python scripts/figures/bench_overhead.py --model T --draft-model D [--k 3] [--repeats 3]
    python scripts/figures/bench_overhead.py --pair demo --profile

Runs plain decoding (macspec and mlx-lm), macspec at a fixed k and with 'auto', and mlx-lm's
stream_generate(..., draft_model=...) at the same k, interleaved prompt by prompt, timed from
the outside (macspec/bench_run.py). Prints tokens per target pass, acceptance, tok/s and time
per target pass side by side, and checks the two goals:
  1. macspec / mlx-lm tok/s >= 1.0 at the same fixed k (per-cycle overhead no higher);
  2. macspec auto no more than 5% slower than plain decoding on this machine.
--profile then runs macspec at the fixed k under cProfile and shows where its time goes.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
from pathlib import Path

from macspec.bench.figures import MACSPEC, MLX_LM, BenchConfig, ConfigSummary, summarize
from macspec.bench.plan import BenchSettings, schedule
from macspec.bench.prompts import builtin, load_prompts
from macspec.bench.runner import Runner
from macspec.errors import MacspecError
from macspec.models.catalog import resolve_models
from macspec.models.loader import load_models
from macspec.models.templates import encode_prompt


def configs(k: int, temperature: float) -> list[BenchConfig]:
    return [
        BenchConfig(MACSPEC, None, temperature),
        BenchConfig(MLX_LM, None, temperature),
        BenchConfig(MACSPEC, str(k), temperature),
        BenchConfig(MLX_LM, str(k), temperature),
        BenchConfig(MACSPEC, "auto", temperature),
    ]


def ms_per_pass(records, config: BenchConfig) -> float | None:
    """Median over runs of the decode seconds per target pass after the first, in ms."""
    values = []
    for r in records:
        if r.config != config or len(r.arrivals) <= r.first_pass_tokens or r.passes < 2:
            continue
        span = r.arrivals[-1] - r.arrivals[r.first_pass_tokens - 1]
        # The pass that produced an end-of-sequence id delivered nothing to time.
        passes = r.passes - 1 - (r.finish_reason == "stop")
        if passes > 0:
            values.append(1000 * span / passes)
    return statistics.median(values) if values else None


def fmt(value: float | None, spec: str) -> str:
    width = "".join(ch for ch in spec.split(".")[0] if ch.isdigit())
    return ("-" if value is None else format(value, spec)).rjust(int(width or 0))


def table(summaries: dict[BenchConfig, ConfigSummary], records) -> None:
    print(
        f"{'config':16} {'tok/s':>8} {'IQR':>15} {'tok/pass':>9} {'accept':>7} {'ms/pass':>8}"
        f" {'vs plain':>9}"
    )
    for config, s in summaries.items():
        d = s.decode_tokens_per_s
        iqr = f"{d.q1:.1f}-{d.q3:.1f}" if d else "-"
        print(
            f"{config.name:16} {fmt(d and d.median, '8.1f')} {iqr:>15} "
            f"{fmt(s.tokens_per_pass, '9.2f')} {fmt(s.acceptance_rate, '7.0%')} "
            f"{fmt(ms_per_pass(records, config), '8.2f')} "
            f"{fmt(s.speedup and s.speedup.median, '8.2f')}x"
        )


def paired_ratio(records, mine: BenchConfig, theirs: BenchConfig) -> list[float]:
    rates = {(r.config, r.prompt, r.repeat): r.decode_tokens_per_s for r in records}
    out = []
    for (config, prompt, repeat), rate in rates.items():
        other = rates.get((theirs, prompt, repeat))
        if config == mine and rate and other:
            out.append(rate / other)
    return out


def profile(runner: Runner, config: BenchConfig, prompt_ids, top: int) -> None:
    profiler = cProfile.Profile()
    profiler.enable()
    for i, ids in enumerate(prompt_ids):
        runner.run(config, ids, i, 0)
    profiler.disable()
    stats = pstats.Stats(profiler, stream=sys.stdout)
    total = sum(entry[2] for entry in stats.stats.values())  # all tottime
    print(f"\ncProfile of {config.name} over {len(prompt_ids)} prompts: {total:.2f} s in total")
    by_file: dict[str, float] = {}
    for (file, _, _), entry in stats.stats.items():
        key = "/".join(Path(file).parts[-2:]) if file.startswith("/") else file
        by_file[key] = by_file.get(key, 0.0) + entry[2]
    print("own time by file:")
    for file, seconds in sorted(by_file.items(), key=lambda x: -x[1])[:12]:
        print(f"  {seconds / total:6.1%} {seconds:7.3f} s  {file}")
    print(f"\ntop {top} functions by own time (file:line of the function):")
    stats.sort_stats("tottime").print_stats(top)
    print(f"top {top} by cumulative time:")
    stats.sort_stats("cumulative").print_stats(top)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair")
    parser.add_argument("--model")
    parser.add_argument("--draft-model")
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--temp", type=float, default=0.0)
    parser.add_argument("--prompts", type=Path, help="one per line or JSONL (default: built-in)")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    try:
        resolved = resolve_models(args.pair, args.model, args.draft_model)
        loaded = load_models(resolved.target, resolved.draft)
        prompts = load_prompts(args.prompts) if args.prompts else builtin()
        settings = BenchSettings(max_tokens=args.max_tokens, ks=(args.k,), repeats=args.repeats)
        runner = Runner(loaded, settings)
    except MacspecError as exc:
        print(f"bench_overhead: error: {exc}", file=sys.stderr)
        return 2
    prompt_ids = [encode_prompt(loaded.tokenizer, p.text) for p in prompts]
    plan = configs(args.k, args.temp)
    for config in plan:  # warm-up, untimed
        runner.run(config, prompt_ids[0], 0, 0, max_tokens=8)
    records = []
    order = schedule(plan, len(prompt_ids), args.repeats)
    for n, (repeat, prompt, config) in enumerate(order, 1):
        print(f"\r{n}/{len(order)} {config.label:24}", end="", file=sys.stderr, flush=True)
        records.append(runner.run(config, prompt_ids[prompt], prompt, repeat))
    print(file=sys.stderr)

    summaries = {s.config: s for s in summarize(records)}
    print(
        f"{resolved.target_name} / {resolved.draft_name}: {len(prompts)} prompts x "
        f"{args.repeats} repeats, max {args.max_tokens} tokens, T={args.temp:g}\n"
    )
    table(summaries, records)
    plain, ours, theirs, auto = plan[0], plan[2], plan[3], plan[4]
    vs_mlx = paired_ratio(records, ours, theirs)
    auto_vs_plain = paired_ratio(records, auto, plain)
    ratio = statistics.median(vs_mlx)
    auto_ratio = statistics.median(auto_vs_plain)
    print(
        f"\nmacspec k={args.k} / mlx-lm k={args.k} tok/s, paired per prompt: median "
        f"{ratio:.3f} (range {min(vs_mlx):.3f}-{max(vs_mlx):.3f}) -> goal >= 1.0 "
        f"{'MET' if ratio >= 1.0 else 'NOT MET'}"
    )
    print(
        f"macspec auto / macspec plain tok/s: median {auto_ratio:.3f} (range "
        f"{min(auto_vs_plain):.3f}-{max(auto_vs_plain):.3f}) -> goal >= 0.95 "
        f"{'MET' if auto_ratio >= 0.95 else 'NOT MET'}"
    )
    plain_ratio = statistics.median(paired_ratio(records, plain, plan[1]))
    print(f"macspec plain / mlx-lm plain tok/s: median {plain_ratio:.3f}")
    if args.profile:
        profile(runner, ours, prompt_ids, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
