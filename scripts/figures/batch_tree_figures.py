"""Draft trees in a batch against chains: aggregate tokens per target pass at 1, 2, 4 and 8
rows, on the demo pair (macspec/demo), per drafter.

    python scripts/figures/batch_tree_figures.py [--drafters model,mtp] [--k 4] [--trees 8,16]
                                                 [--max-tokens 64] [--rows 1,2,4,8]

For each number of rows c, the first c held-out prompts of the demo corpus start together in a
fresh BatchEngine, as `macspec serve --max-batch 8` would run them: chains of k guesses (-k k)
against trees of at most N nodes, k deep (--draft-tree N). Aggregate tokens per target pass:
every row's tokens (an end of sequence included) over the batch's passes, the figure batching
and trees multiply together; per row: each row's own tokens per pass, averaged. Every row's
greedy output is checked against mlx-lm's target-alone greedy (generate_step).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "tests"))

from losslesskit import reference  # noqa: E402

from macspec.engine.generate.loop import GenerationConfig  # noqa: E402
from macspec.models.build import batch_engine_for, load_for_drafting  # noqa: E402
from macspec.models.catalog import resolve_models  # noqa: E402
from macspec.models.templates import encode_prompt  # noqa: E402

EVAL = HERE.parent / "demo_eval_prompts.jsonl"


def run_level(engine, prompts: list[list[int]], max_tokens: int) -> dict:
    """The rows decoded together; what they generated and how many passes it took."""
    started = time.perf_counter()
    rows = [engine.admit(p, GenerationConfig(max_tokens=max_tokens)) for p in prompts]
    for row in rows:
        while not engine.prefill_step(row):
            pass
    passes = engine.passes
    while any(row.done is None for row in rows):
        engine.step()
    stats = [row.done.stats for row in rows]
    decided = sum(s.generated_tokens + s.end_tokens for s in stats)
    return dict(
        tokens=[row.done.tokens for row in rows],
        per_pass=decided / max(engine.passes - passes, 1),
        row_per_pass=sum(s.tokens_per_pass or 0.0 for s in stats) / len(stats),
        tree_cycles=sum(s.tree_cycles for s in stats),
        nodes=sum(s.tree_nodes for s in stats) / max(sum(s.tree_cycles for s in stats), 1),
        rows_per_pass=max(s.rows_per_pass or 1.0 for s in stats),
        seconds=time.perf_counter() - started,
        decided=decided,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drafters", default="model,mtp")
    parser.add_argument("--k", type=int, default=4, help="chain length, and the trees' depth")
    parser.add_argument("--trees", default="8,16", help="tree sizes (--draft-tree N)")
    parser.add_argument("--rows", default="1,2,4,8")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    levels = [int(c) for c in args.rows.split(",")]
    configs = [("chain", None)] + [(f"tree {n}", n) for n in args.trees.split(",")]
    resolved = resolve_models("demo", None, None)
    texts = [json.loads(line)["prompt"] for line in EVAL.read_text().splitlines()[: max(levels)]]
    results = []
    print(
        "| drafter | verifies | rows | tokens per pass (all rows) | per row | tree nodes "
        "| rows per pass | tokens/s | outputs = mlx-lm |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for drafter in args.drafters.split(","):
        loaded, source, spec = load_for_drafting(resolved, str(args.k), False, drafter)
        eos = frozenset(loaded.tokenizer.eos_token_ids)
        prompts = [encode_prompt(loaded.tokenizer, text) for text in texts]
        wants = [reference(loaded.target, p, args.max_tokens, eos) for p in prompts]
        for label, tree in configs:
            for c in levels:
                engine = batch_engine_for(loaded, source, spec, draft_tree=tree)
                got = run_level(engine, prompts[:c], args.max_tokens)
                same = sum(t == w for t, w in zip(got.pop("tokens"), wants[:c]))
                nodes = f"{got['nodes']:.1f}" if got["tree_cycles"] else "-"
                print(
                    f"| {drafter} | {label} | {c} | {got['per_pass']:.2f} | "
                    f"{got['row_per_pass']:.2f} | {nodes} | {got['rows_per_pass']:.1f} | "
                    f"{got['decided'] / got['seconds']:.0f} | {same}/{c} |",
                    flush=True,
                )
                results.append(dict(drafter=drafter, verifies=label, rows=c, same=same, **got))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
