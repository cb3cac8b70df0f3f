"""Distributed runs for the tests: the scenarios both ranks play under mlx.launch, and the
single-process references they are compared with.

`python tests/distkit.py OUT TARGET DRAFT` (started by `mlx.launch -n 2 --backend ring`) plays
every scenario on every rank through macspec's own distributed path and writes one JSON line
per scenario to OUT/rank<r>.jsonl; the last scenario kills rank 1 mid-answer.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import sys
import time
from pathlib import Path

PROMPT = [256, 72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100]
MAX_TOKENS = 32

SCENARIOS: dict[str, dict] = {
    # name: build_engine arguments and generation settings
    "plain": dict(no_draft=True),
    "k4": dict(k="4"),
    "auto": dict(k="auto"),
    "coupled": dict(k="3", temp=0.8, seed=3),
    "coupled-plain": dict(no_draft=True, temp=0.8, seed=3),
    "rejection": dict(k="3", temp=0.8, seed=5, sampler="rejection"),
    "unseeded": dict(k="3", temp=0.8),
    "lookup": dict(k="3", draft="lookup"),
}


def resolved(target: Path, draft: Path | None):
    from macspec.models.catalog import ResolvedModels

    return ResolvedModels(target, draft, str(target), str(draft) if draft else None, None)


def play(name: str, target: Path, draft: Path, group=None, watchdog=None) -> dict:
    """One scenario: its tokens, cycles (k asked, proposed, accepted) and stats."""
    from macspec.engine.core.events import Cycle, Done
    from macspec.engine.core.sampling import SamplingParams
    from macspec.engine.generate.loop import GenerationConfig
    from macspec.models.build import build_engine

    spec = SCENARIOS[name]
    no_draft = spec.get("no_draft", False)
    engine, _ = build_engine(
        resolved(target, None if no_draft else draft),
        spec.get("k"),
        no_draft,
        spec.get("draft"),
        group=group,
        watchdog=watchdog,
    )
    config = GenerationConfig(
        max_tokens=MAX_TOKENS,
        sampling=SamplingParams(temperature=spec.get("temp", 0.0)),
        seed=spec.get("seed"),
        sampler=spec.get("sampler"),
    )
    cycles, done = [], None
    for event in engine.generate(PROMPT, config):
        if isinstance(event, Cycle):
            cycles.append([event.requested, event.proposed, event.accepted])
        elif isinstance(event, Done):
            done = event
    agreed = getattr(engine, "agreed", None)
    return {
        "name": name,
        "tokens": done.tokens,
        "cycles": cycles,
        "passes": done.stats.target_passes,
        "accepted": done.stats.draft_accepted,
        "proposed": done.stats.draft_proposed,
        "overruled": agreed.overruled if agreed is not None else 0,
        "exchanges": engine.exchange.count if group is not None else 0,
    }


def cli(argv: list[str]) -> dict:
    """`macspec ARGV` in this process: exit code, stdout and stderr."""
    from macspec.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return {"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()}


def run_args(target: Path, draft: Path, *more: str) -> list[str]:
    return ["run", "--model", str(target), "--draft-model", str(draft), "--raw", "--json",
            "--max-tokens", str(MAX_TOKENS), *more, "Hello, world"]  # fmt: skip


def skewed(group, target: Path, draft: Path, watchdog) -> dict:
    """Ranks whose own policies want different k (as timings would make them): rank 0's wins."""
    from macspec.engine.core.events import Cycle, Done
    from macspec.engine.generate.distributed import AgreedPolicy
    from macspec.engine.generate.loop import GenerationConfig
    from macspec.engine.policy.length import FixedPolicy
    from macspec.models.build import build_engine

    engine, _ = build_engine(resolved(target, draft), "4", group=group, watchdog=watchdog)
    engine.agreed.inner = FixedPolicy(4 if group.rank() == 0 else 1)
    assert isinstance(engine.policy, AgreedPolicy)
    cycles, done = [], None
    for event in engine.generate(PROMPT, GenerationConfig(max_tokens=MAX_TOKENS)):
        if isinstance(event, Cycle):
            cycles.append([event.requested, event.proposed, event.accepted])
        elif isinstance(event, Done):
            done = event
    return {"name": "skewed", "tokens": done.tokens, "cycles": cycles,
            "overruled": engine.agreed.overruled}  # fmt: skip


def main() -> None:
    out, target, draft = (Path(a) for a in sys.argv[1:4])
    # mlx.launch stops the survivor with SIGTERM once a rank dies: finish writing first.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    from macspec.engine.generate.distributed import Watchdog, world

    group = world()
    rank = group.rank()
    watchdog = Watchdog(lambda idle: os._exit(3), timeout=60).start()
    log = (out / f"rank{rank}.jsonl").open("w")

    def write(record: dict) -> None:
        log.write(json.dumps(record) + "\n")
        log.flush()

    for name in SCENARIOS:
        write(play(name, target, draft, group, watchdog))
    write(skewed(group, target, draft, watchdog))
    write({"name": "cli", **cli(run_args(target, draft, "-k", "3"))})
    watchdog.stop()

    # Last: rank 1 dies after a few tokens of an answer; rank 0 must end with one clear line.
    if rank == 1:
        from macspec.engine.generate import distributed

        generate = distributed.DistributedEngine.generate

        def dying(self, *args, **kwargs):
            for i, event in enumerate(generate(self, *args, **kwargs)):
                if i == 6:
                    write({"name": "killed", "at": time.time()})
                    os.kill(os.getpid(), signal.SIGKILL)
                yield event

        distributed.DistributedEngine.generate = dying
    result = cli(run_args(target, draft, "-k", "2", "--max-tokens", "400"))
    write({"name": "survivor", "at": time.time(), **result})


if __name__ == "__main__":
    main()
