"""Acceptance and tokens per target pass of a pair on held-out prompts, greedy and sampled.

    python scripts/figures/demo_figures.py                      # the shipped demo pair, 20 prompts
    python scripts/figures/demo_figures.py --pair NAME --prompts FILE.jsonl -n 40
    python scripts/figures/demo_figures.py --drafters model,mtp,lookup --temps 0   # side by side

Greedy runs are also checked token for token against mlx-lm's target-only decoding.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import mlx.core as mx
from mlx_lm.generate import generate_step

from macspec.engine.core.sampling import SamplingParams
from macspec.engine.generate.loop import Engine, GenerationConfig
from macspec.engine.policy.length import make_policy
from macspec.models.build import drafter_folders, load_drafters, make_drafter
from macspec.models.catalog import resolve_models
from macspec.models.templates import encode_prompt

HERE = Path(__file__).parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="demo")
    parser.add_argument("--prompts", type=Path, default=HERE.parent / "demo_eval_prompts.jsonl")
    parser.add_argument("-n", type=int, default=20, help="prompts to use")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--policies", default="4,auto")
    parser.add_argument("--temps", default="0,0.7,1.0")
    parser.add_argument("--drafters", default="model", help="comma list: model, mtp, lookup, ...")
    args = parser.parse_args()

    resolved = resolve_models(args.pair, None, None)
    drafters = args.drafters.split(",")
    loaded = load_drafters(resolved, drafter_folders(resolved, "auto"), set(drafters))
    lines = args.prompts.read_text().splitlines()[: args.n]
    prompts = [encode_prompt(loaded.tokenizer, json.loads(line)["prompt"]) for line in lines]
    eos = set(loaded.tokenizer.eos_token_ids)
    references = []
    for ids in prompts:
        ref = []
        for token, _ in generate_step(mx.array(ids), loaded.target, max_tokens=args.max_tokens):
            if token in eos:
                break
            ref.append(token)
        references.append(ref)

    rows = []
    for drafter, temp, spec in [
        (d, float(t), p)
        for d in drafters
        for t in args.temps.split(",")
        for p in args.policies.split(",")
    ]:
        totals = dict(proposed=0, accepted=0, generated=0, passes=0, mismatches=0)
        for i, (ids, ref) in enumerate(zip(prompts, references)):
            engine = Engine(
                loaded.target,
                loaded.tokenizer,
                make_drafter(drafter, loaded),
                make_policy(spec),
                vocab_size=loaded.vocab_size,
            )
            config = GenerationConfig(
                max_tokens=args.max_tokens, sampling=SamplingParams(temperature=temp), seed=i
            )
            done = list(engine.generate(ids, config))[-1]
            stats = done.stats
            totals["proposed"] += stats.draft_proposed
            totals["accepted"] += stats.draft_accepted
            totals["generated"] += stats.generated_tokens
            totals["passes"] += stats.target_passes
            totals["mismatches"] += temp == 0 and done.tokens != ref
        row = {
            "drafter": drafter,
            "temp": temp,
            "k": spec,
            "prompts": len(prompts),
            "acceptance": totals["accepted"] / max(1, totals["proposed"]),
            "tokens_per_pass": totals["generated"] / max(1, totals["passes"]),
            "proposed": totals["proposed"],
            "generated": totals["generated"],
            "greedy_mismatches": totals["mismatches"] if temp == 0 else None,
        }
        rows.append(row)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
