"""Which drafter `--draft auto` picks on a pair, at each temperature, and what each draft model
keeps at a fixed k: the measurement behind the demo pair's order of drafts.

    python scripts/figures/draft_choice_figures.py  # demo, held-out prompts 1-20
    python scripts/figures/draft_choice_figures.py --first 20 -n 40  # prompts 21-60, never tuned on

Three parts. (1) Each draft model of the pair alone at a fixed k: acceptance and tokens per
target pass, greedy and sampled. (2) `--draft auto` as `macspec run` has it (a fresh engine per
prompt): the candidate it picked last, counted over the prompts, and the guesses each candidate
made. (3) One engine kept across the prompts, T = 0 and T = 0.7 alternating (as a server gets
them): its pick at each temperature at the end. Greedy outputs are checked against plain
decoding.
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

from macspec.engine.core.events import Done
from macspec.engine.core.sampling import SamplingParams
from macspec.engine.drafters.model import ModelDrafter
from macspec.engine.generate.loop import Engine, GenerationConfig
from macspec.engine.policy.length import FixedPolicy
from macspec.models.build import drafter_folders, load_drafters, make_drafter, model_labels
from macspec.models.catalog import resolve_models
from macspec.models.templates import encode_prompt

HERE = Path(__file__).parent


def done_of(engine: Engine, ids: list[int], temperature: float, seed: int, max_tokens: int):
    config = GenerationConfig(
        max_tokens=max_tokens, sampling=SamplingParams(temperature=temperature), seed=seed
    )
    return next(e for e in engine.generate(ids, config) if isinstance(e, Done))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="demo")
    parser.add_argument("--prompts", type=Path, default=HERE.parent / "demo_eval_prompts.jsonl")
    parser.add_argument("--first", type=int, default=0, help="prompts to skip")
    parser.add_argument("-n", type=int, default=20, help="prompts to use")
    parser.add_argument("-k", type=int, default=4, help="the fixed k of part 1")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--temps", default="0,0.7")
    args = parser.parse_args()

    resolved = resolve_models(args.pair, None, None)
    folders = drafter_folders(resolved, "auto")
    loaded = load_drafters(resolved, folders, set(folders), more_drafts=True)
    lines = args.prompts.read_text().splitlines()[args.first : args.first + args.n]
    prompts = [encode_prompt(loaded.tokenizer, json.loads(line)["prompt"]) for line in lines]
    temps = [float(t) for t in args.temps.split(",")]
    plain = Engine(loaded.target, loaded.tokenizer)
    references = [done_of(plain, ids, 0.0, 0, args.max_tokens).tokens for ids in prompts]
    models = {loaded.draft_name: loaded.draft, **loaded.more_drafts}
    labels = dict(zip(models, model_labels(list(models))))
    print(f"{args.pair}: prompts {args.first + 1}-{args.first + len(prompts)}, ", end="")
    print(f"{args.max_tokens} tokens; draft models {', '.join(labels.values())}")

    print(f"\n(1) each draft model alone, k = {args.k}")
    for temperature in temps:
        for name, model in models.items():
            proposed = accepted = generated = passes = mismatches = 0
            for i, (ids, reference) in enumerate(zip(prompts, references)):
                drafter = ModelDrafter(model, vocab_size=loaded.vocab_size)
                engine = Engine(
                    loaded.target, loaded.tokenizer, drafter, FixedPolicy(args.k), loaded.vocab_size
                )
                done = done_of(engine, ids, temperature, i, args.max_tokens)
                s = done.stats
                proposed, accepted = proposed + s.draft_proposed, accepted + s.draft_accepted
                generated, passes = generated + s.generated_tokens, passes + s.target_passes
                mismatches += temperature == 0 and done.tokens != reference
            print(
                f"  T={temperature:g} {labels[name]:24} acceptance {accepted / proposed:.2f}, "
                f"tokens per pass {generated / passes:.2f}"
                + (f", {mismatches} outputs NOT identical" if mismatches else "")
            )

    print("\n(2) --draft auto, a fresh engine per prompt (as macspec run)")
    for temperature in temps:
        picks: collections.Counter = collections.Counter()
        guesses: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
        for i, (ids, reference) in enumerate(zip(prompts, references)):
            choice = make_drafter("auto", loaded)
            engine = Engine(loaded.target, loaded.tokenizer, choice, choice, loaded.vocab_size)
            done = done_of(engine, ids, temperature, i, args.max_tokens)
            assert temperature > 0 or done.tokens == reference, "greedy output differs"
            picks[choice.current] += 1
            for source, (p, a) in done.stats.by_source.items():
                guesses[source][0] += p
                guesses[source][1] += a
        shown = ", ".join(f"{name} {count}" for name, count in picks.most_common())
        print(f"  T={temperature:g}: last pick per prompt: {shown}")
        for source, (p, a) in sorted(guesses.items()):
            print(f"    {source:24} {a}/{p} guesses kept" + (f" ({a / p:.2f})" if p else ""))

    print("\n(3) one engine across the prompts, the temperatures alternating (as a server)")
    choice = make_drafter("auto", loaded)
    engine = Engine(loaded.target, loaded.tokenizer, choice, choice, loaded.vocab_size)
    reasons = {}
    for i, ids in enumerate(prompts):
        for temperature in temps:
            done = done_of(engine, ids, temperature, i, args.max_tokens)
            reasons[temperature] = (choice.current, done.stats.drafter_choice)
    for temperature, (current, reason) in reasons.items():
        print(f"  T={temperature:g}: picks {current}; {reason}")


if __name__ == "__main__":
    main()
