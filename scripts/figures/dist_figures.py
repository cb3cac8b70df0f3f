"""The cost of a target pass over m = 1..8 ids, alone and sharded over 2 ranks, side by side, and
the latency of one small all-reduce: what speculation on a sharded target buys.

    python scripts/figures/dist_figures.py [--model macspec/demo/target] [--rounds 15]
        [--json out.json]

Run as is, it times the whole target in this process, then starts itself under
`mlx.launch -n 2 --backend ring` (localhost) to time the sharded target (mlx-lm's sharded load,
through macspec's loader) and `mx.distributed.all_sum` of a 4 KB tensor. The passes are timed by
macspec bench's own cost sampler (warm caches, rotated m, medians). On one machine both ranks
share its cores: the 2-rank figures are the all-reduce's price, not a speedup.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "macspec" / "demo" / "target"
PROMPT = list(range(16, 48))
"""Ids of the context the passes are timed after (any ids the demo vocabulary holds)."""
MAX_M = 8


def pass_costs(model: Path, rounds: int, group=None) -> list[float]:
    """Median seconds of a target pass over m = 1..MAX_M ids, by m (sharded over `group`)."""
    from macspec.bench.cost import CostSampler
    from macspec.models.loader import load_model

    target, _ = load_model(model, "target model", group)
    sampler = CostSampler(target, None, PROMPT, MAX_M)
    for _ in range(rounds):
        sampler.round()
    return [median(sampler.target_s[m]) for m in range(1, MAX_M + 1)]


def all_sum_latency(group, nbytes: int = 4096, times: int = 300) -> float:
    """Median seconds of one all_sum of `nbytes` of float32, evaluated alone."""
    import mlx.core as mx

    x = mx.ones((nbytes // 4,), mx.float32)
    took = []
    for i in range(times + 30):  # the first 30 warm the connection up
        started = time.perf_counter()
        mx.eval(mx.distributed.all_sum(x, group=group))
        if i >= 30:
            took.append(time.perf_counter() - started)
    return median(took)


def rank_main(model: Path, rounds: int, out: Path) -> None:
    """One rank of the launch: the sharded curve and the all-reduce latency; rank 0 writes."""
    from macspec.engine.generate.distributed import world

    group = world()
    costs = pass_costs(model, rounds, group)
    latency = all_sum_latency(group)
    if group.rank() == 0:
        out.write_text(json.dumps({"ranks": group.size(), "pass_s": costs, "all_sum_s": latency}))


def launch(model: Path, rounds: int) -> dict:
    launcher = shutil.which("mlx.launch", path=str(Path(sys.executable).parent))
    if launcher is None:
        sys.exit("mlx.launch not found next to this interpreter (it comes with mlx)")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rank0.json"
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        }
        command = [launcher, "-n", "2", "--backend", "ring", "--", sys.executable, __file__]
        command += ["--model", str(model), "--rounds", str(rounds), "--rank-out", str(out)]
        subprocess.run(command, env=env, check=True, timeout=600)
        return json.loads(out.read_text())


def layers(model: Path) -> int:
    return int(json.loads((model / "config.json").read_text())["num_hidden_layers"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEMO, help="the target folder")
    parser.add_argument("--rounds", type=int, default=15, help="timings per m (medians)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--rank-out", type=Path, help=argparse.SUPPRESS)  # set by the launch
    args = parser.parse_args(argv)
    if args.rank_out is not None:
        rank_main(args.model, args.rounds, args.rank_out)
        return 0
    alone = pass_costs(args.model, args.rounds)
    sharded = launch(args.model, args.rounds)
    two, latency = sharded["pass_s"], sharded["all_sum_s"]
    n = layers(args.model)
    print(f"{args.model.name}: a target pass over m ids, ms (median of {args.rounds})")
    print(f"{'m':>3} {'1 rank':>8} {'2 ranks':>8} {'T1(m)/T1(1)':>12} {'T2(m)/T2(1)':>12}")
    for m in range(MAX_M):
        print(
            f"{m + 1:>3} {alone[m] * 1e3:>8.2f} {two[m] * 1e3:>8.2f} "
            f"{alone[m] / alone[0]:>12.2f} {two[m] / two[0]:>12.2f}"
        )
    print(f"all_sum of 4 KB over 2 ranks (ring, localhost): {latency * 1e6:.0f} us median")
    print(
        f"tensor parallelism all-reduces twice per layer: {n} layers -> "
        f"{2 * n * latency * 1e3:.2f} ms of every pass, whatever m"
    )
    if args.json is not None:
        figures = {"model": str(args.model), "layers": n, "rounds": args.rounds,
                   "pass_s": {"1": alone, "2": two}, "all_sum_4kb_s": latency}  # fmt: skip
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
