"""Draft trees in a batch against chains: aggregate tokens per target pass at 1, 2, 4 and 8
rows, on the demo pair (macspec/demo) per drafter, and on the agents' captured requests.

    python scripts/figures/batch_tree_figures.py [--drafters model,mtp] [--k 4] [--trees 8,16]
                                                 [--max-tokens 64] [--rows 1,2,4,8]
    python scripts/figures/batch_tree_figures.py --agents   # tests/fixtures/agents

For each number of rows c, the first c held-out prompts of the demo corpus start together in a
fresh BatchEngine, as `macspec serve --max-batch 8` would run them (--agents: the agents' six
captured requests, first and follow-up, rendered with their tools by the tiny tool model of
tests/toolkit.py, its noisy copy drafting; taken in turn): chains of k guesses (-k k)
against trees of at most N nodes, k deep (--draft-tree N). Aggregate tokens per target pass:
every row's tokens (an end of sequence included) over the batch's passes, the figure batching
and trees multiply together; per row: each row's own tokens per pass, averaged. Every row's
greedy output is checked against mlx-lm's target-alone greedy (generate_step).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "tests"))

from losslesskit import reference  # noqa: E402
from toolkit import agent_chat  # noqa: E402

from macspec.engine.generate.loop import GenerationConfig  # noqa: E402
from macspec.models.build import batch_engine_for, load_for_drafting  # noqa: E402
from macspec.models.catalog import resolve_models  # noqa: E402
from macspec.models.templates import encode_messages, encode_prompt  # noqa: E402

EVAL = HERE.parent / "demo_eval_prompts.jsonl"
AGENTS = ("claude_code", "codex", "opencode")


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


def agent_requests():
    """The tool model and its noisy draft, saved in a temporary folder, resolved."""
    from toolkit import save_tool_draft, save_tool_model

    root = Path(tempfile.mkdtemp())
    target, draft = save_tool_model(root / "target"), save_tool_draft(root / "draft")
    return resolve_models(None, str(target), str(draft))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drafters", default="model,mtp")
    parser.add_argument("--k", type=int, default=4, help="chain length, and the trees' depth")
    parser.add_argument("--trees", default="8,16", help="tree sizes (--draft-tree N)")
    parser.add_argument("--rows", default="1,2,4,8")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--agents", action="store_true", help="the agents' captured requests")
    args = parser.parse_args()
    levels = [int(c) for c in args.rows.split(",")]
    configs = [("chain", None)] + [(f"tree {n}", n) for n in args.trees.split(",")]
    if args.agents:
        resolved, texts = agent_requests(), None
        args.drafters = "model"
    else:
        resolved = resolve_models("demo", None, None)
        lines = EVAL.read_text().splitlines()[: max(levels)]
        texts = [json.loads(line)["prompt"] for line in lines]
    results = []
    print(
        "| drafter | verifies | rows | tokens per pass (all rows) | per row | tree nodes "
        "| rows per pass | tokens/s | outputs = mlx-lm |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for drafter in args.drafters.split(","):
        loaded, source, spec = load_for_drafting(resolved, str(args.k), False, drafter)
        eos = frozenset(loaded.tokenizer.eos_token_ids)
        if texts is None:  # the agents' requests, as their servers render them
            chats = [agent_chat(a, f) for a in AGENTS for f in (False, True)]
            ids = [encode_messages(loaded.tokenizer, m, tools=t) for m, t in chats]
            prompts = [ids[i % len(ids)] for i in range(max(levels))]
        else:
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
