"""Where prompt lookup's kept guesses were found: in the prompt, or in the answer so far.

Dev tool. Lookup pays on input-grounded answers (the target copies its prompt) and also when a
target repeats its own output; this tells the two apart on the bench's grounded prompts:

    python scripts/figures/lookup_match_origin.py --pair demo -k 4 --max-tokens 200
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from macspec.bench.prompts import GROUNDED
from macspec.engine.core.events import Cycle, Done
from macspec.engine.drafters.lookup import LookupDrafter
from macspec.engine.drafters.protocol import Draft
from macspec.engine.generate.loop import Engine, GenerationConfig
from macspec.engine.policy.length import FixedPolicy
from macspec.models.catalog import resolve_models
from macspec.models.loader import load_models
from macspec.models.templates import encode_prompt


class OriginLookup(LookupDrafter):
    """A lookup drafter that names its guesses by where their continuation began: the cycle
    records carry it as their draft source (the engine may draft a cycle ahead of the record
    of the one before, so the drafter's latest call is not the cycle being recorded)."""

    prompt_length = 0

    def start(self, prompt: Sequence[int]) -> None:
        self.prompt_length = len(prompt)
        super().start(prompt)

    def propose(self, context: Sequence[int], k: int, *args) -> Draft:
        found = self.match(context, k)
        draft = super().propose(context, k, *args)
        if found is not None:
            draft.source = "prompt" if found.start < self.prompt_length else "answer"
        return draft


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="demo")
    parser.add_argument("-k", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=200)
    args = parser.parse_args(argv)
    resolved = resolve_models(args.pair, None, None)
    loaded = load_models(resolved.target, None)
    drafter = OriginLookup()
    engine = Engine(loaded.target, loaded.tokenizer, drafter, FixedPolicy(args.k))
    totals = {"prompt": 0, "answer": 0}
    print(f"{'prompt':<16}{'kept from prompt':>18}{'kept from answer':>18}{'tok/pass':>10}")
    for prompt in GROUNDED:
        ids = encode_prompt(loaded.tokenizer, prompt.text)
        kept = {"prompt": 0, "answer": 0}
        for event in engine.generate(ids, GenerationConfig(max_tokens=args.max_tokens)):
            if isinstance(event, Cycle) and event.draft_source in kept:
                kept[event.draft_source] += event.accepted
            elif isinstance(event, Done):
                per_pass = event.stats.tokens_per_pass or 0.0
        print(f"{prompt.name:<16}{kept['prompt']:>18}{kept['answer']:>18}{per_pass:>10.2f}")
        for where in totals:
            totals[where] += kept[where]
    print(f"{'all':<16}{totals['prompt']:>18}{totals['answer']:>18}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
