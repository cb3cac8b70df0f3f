"""Replicated draft vs a draft on rank 0 whose guesses are broadcast: which is cheaper on a
sharded target (issue 19). Greedy, the demo pair, both ranks on this machine.

    python scripts/figures/dist_draft_placement.py [--prompts 4] [--max-tokens 64] [--repeats 2]

Starts itself under `mlx.launch -n 2 --backend ring`. Each rank builds the same sharded engine;
"replicated" is macspec's way (every rank drafts the same guesses, nothing travels), "broadcast"
drafts on rank 0 only and sends the guesses with one `all_gather` per cycle (lazy: no host read).
Both must give the same tokens; rank 0 prints the decode time per token of each, interleaved.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from statistics import median

REPO = Path(__file__).resolve().parents[2]


class BroadcastDrafter:
    """Rank 0 drafts with `inner`; every rank gets rank 0's guesses through one all_gather."""

    needs = None  # the Drafter protocol's defaults (subclassing it would load MLX here)

    def __init__(self, inner, group):
        self.inner, self.group = inner, group
        self.name = inner.name

    def caches(self) -> list:
        return []

    def active(self):
        return self

    def start(self, prompt) -> None:
        if self.group.rank() == 0:
            self.inner.start(prompt)

    def rollback(self, keep: int) -> None:
        if self.group.rank() == 0:
            self.inner.rollback(keep)

    def propose(self, context, k, params, draws, floor):
        import mlx.core as mx

        from macspec.engine.drafters.model import Draft

        if self.group.rank() == 0:
            draft = self.inner.propose(context, k, params, draws, None)
            mine, steps, fed = draft.tokens, draft.steps, draft.fed
        else:
            mine, steps, fed = mx.zeros((k,), mx.uint32), 0, 0
        every = mx.distributed.all_gather(mine.astype(mx.uint32), group=self.group)
        return Draft(every[:k], steps=steps, fed=fed, source=self.name)


def rank_main(prompts: int, max_tokens: int, repeats: int) -> None:
    import mlx.core as mx

    from macspec.bench.prompts import builtin
    from macspec.engine.core.events import Done
    from macspec.engine.generate.loop import GenerationConfig
    from macspec.models.build import build_engine
    from macspec.models.catalog import resolve_models
    from macspec.models.templates import encode_prompt

    group = mx.distributed.init()
    resolved = resolve_models("demo", None, None)
    engines = {}
    for name in ("replicated", "broadcast"):
        engine, loaded = build_engine(resolved, "3", draft="model", group=group)
        if name == "broadcast":
            engine.engine.drafter = BroadcastDrafter(engine.engine.drafter, group)
        engines[name] = engine
    ids = [encode_prompt(loaded.tokenizer, p.text) for p in builtin()[:prompts]]
    config = GenerationConfig(max_tokens=max_tokens)
    per_token = {name: [] for name in engines}
    for repeat in range(repeats + 1):  # the first round warms up, untimed
        for i, prompt in enumerate(ids):
            tokens = {}
            order = list(engines) if (repeat + i) % 2 == 0 else list(engines)[::-1]
            for name in order:
                started = time.perf_counter()
                done = [e for e in engines[name].generate(prompt, config) if isinstance(e, Done)]
                elapsed = time.perf_counter() - started
                tokens[name] = done[0].tokens
                if repeat:
                    per_token[name].append(elapsed / max(1, len(done[0].tokens)))
            assert tokens["replicated"] == tokens["broadcast"], "the placements disagree"
    if group.rank() == 0:
        for name, values in per_token.items():
            print(f"{name:10} {median(values) * 1e3:7.2f} ms per token (median of {len(values)})")
        ratio = median(b / r for r, b in zip(per_token["replicated"], per_token["broadcast"]))
        print(f"broadcast / replicated time per token, paired: {ratio:.3f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rank:
        rank_main(args.prompts, args.max_tokens, args.repeats)
        return 0
    launcher = shutil.which("mlx.launch", path=str(Path(sys.executable).parent))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [launcher, "-n", "2", "--backend", "ring", "--", sys.executable, __file__, "--rank"]
    command += ["--prompts", str(args.prompts), "--max-tokens", str(args.max_tokens)]
    command += ["--repeats", str(args.repeats)]
    return subprocess.run(command, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
