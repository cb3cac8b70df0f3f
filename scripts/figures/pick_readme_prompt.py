"""Pick README's first prompt by measurement: the held-out prompt the demo pair answers best.

    python scripts/figures/pick_readme_prompt.py -n 150     # the first 150 held-out prompts

For each held-out prompt (never trained on) the demo pair answers greedily at k = 4; an answer
counts only if its code parses as Python, defines the function the prompt names, ends by
itself (EOS, not --max-tokens), does not call itself, and repeats no line. Among those, prompts
are ranked by tokens per target pass, and the top few are printed with their answers.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
from pathlib import Path

from macspec.engine.generate.loop import Engine, GenerationConfig
from macspec.engine.policy.length import FixedPolicy
from macspec.models.build import drafter_folders, load_drafters, make_drafter
from macspec.models.catalog import resolve_models
from macspec.models.templates import encode_prompt

HERE = Path(__file__).parent


def code_of(answer: str) -> str:
    """The answer's code: inside ``` fences when there are any, else the whole answer."""
    fenced = re.findall(r"```(?:python)?\n(.*?)```", answer, flags=re.S)
    return "\n".join(fenced) if fenced else answer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=60, help="held-out prompts to try")
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--top", type=int, default=5)
    args = parser.parse_args()

    resolved = resolve_models("demo", None, None)
    loaded = load_drafters(resolved, drafter_folders(resolved, "auto"), {"model"})
    lines = (HERE.parent / "demo_eval_prompts.jsonl").read_text().splitlines()[: args.n]
    scored = []
    for line in lines:
        text = json.loads(line)["prompt"]
        engine = Engine(
            loaded.target,
            loaded.tokenizer,
            make_drafter("model", loaded),
            FixedPolicy(4),
            vocab_size=loaded.vocab_size,
        )
        ids = encode_prompt(loaded.tokenizer, text)
        done = list(engine.generate(ids, GenerationConfig(max_tokens=args.max_tokens)))[-1]
        asked = re.search(r"`(?:\w+\.)?(\w+)\(", text)
        try:
            tree = ast.parse(code_of(done.text))
            defined = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        except SyntaxError:
            defined = set()
        said = [line.strip() for line in done.text.splitlines() if line.strip()]
        if len(set(said)) < len(said) or (
            asked and f"{asked.group(1)}(" in done.text.split(":", 1)[-1]
        ):
            defined = set()  # a line said twice, or a body that calls the function itself
        per_pass = done.stats.tokens_per_pass or 0.0
        if asked and asked.group(1) in defined and done.finish_reason == "stop":
            scored.append((per_pass, text, done.text, done.stats.acceptance_rate))
    scored.sort(key=lambda row: -row[0])
    print(f"{len(scored)} of {len(lines)} answers parse and end by themselves")
    for per_pass, text, answer, acceptance in scored[: args.top]:
        print(f"\n{per_pass:.2f} tokens/pass, acceptance {acceptance:.0%}: {text}\n{answer}")


if __name__ == "__main__":
    main()
