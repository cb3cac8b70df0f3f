"""Tokens per target pass and acceptance of --draft lookup vs model vs hybrid, greedy.

Dev tool (the figures in the lookup closing note):

    .venv/bin/python scripts/figures/lookup_figures.py --pair demo -k 4
    python scripts/figures/lookup_figures.py --model M --draft-model D -k 8 --json out.json

The prompt set is input-grounded, as prompt lookup is meant for, and built from the Python
standard library (what the demo pair was trained on): documented functions of a few modules,
each asked for in three ways:
  edit    the request, with the function's current code quoted in the prompt
  again   a second turn: the first answer (the code) is in the history, the request repeated
  fresh   the request alone (control: lookup sees only the prompt and its own output)
Every answer is checked against plain target decoding: all sources must give the same ids.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import sysconfig
import textwrap
from pathlib import Path

from macspec.engine.core.events import Done
from macspec.engine.generate.loop import GenerationConfig
from macspec.models.build import build_engine
from macspec.models.catalog import resolve_models
from macspec.models.templates import encode_messages

MODULES = (
    "textwrap",
    "shutil",
    "fnmatch",
    "posixpath",
    "string",
    "glob",
    "base64",
    "csv",
    "gettext",
    "ipaddress",
    "json/encoder",
    "json/decoder",
    "calendar",
    "difflib",
)
SOURCES = ("none", "model", "lookup", "hybrid")
KINDS = ("edit", "again", "fresh")


def functions(count: int, max_chars: int = 700) -> list[tuple[str, str]]:
    """(request, code) for documented top-level functions, in a fixed order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    found = []
    for module in MODULES:
        path = root / f"{module}.py"
        if not path.is_file():
            continue
        source = path.read_text(encoding="utf-8")
        lines = source.splitlines()
        for node in ast.parse(source).body:
            if not isinstance(node, ast.FunctionDef) or not ast.get_docstring(node):
                continue
            code = textwrap.dedent("\n".join(lines[node.lineno - 1 : node.end_lineno]))
            if len(code) > max_chars or not code.startswith("def "):
                continue
            summary = " ".join(ast.get_docstring(node).strip().split("\n\n")[0].split())
            request = f"Write a Python function `{node.name}({ast.unparse(node.args)})`: {summary}"
            found.append((request, code.strip("\n")))
            break  # one per module keeps the set varied
        if len(found) == count:
            break
    return found


def conversations(count: int) -> list[tuple[str, list[dict]]]:
    chats = []
    for request, code in functions(count):
        quoted = f"{request}\n\nThe current version, to edit:\n```python\n{code}\n```"
        chats.append(("edit", [{"role": "user", "content": quoted}]))
        chats.append(
            (
                "again",
                [
                    {"role": "user", "content": request},
                    {"role": "assistant", "content": code},
                    {"role": "user", "content": request},
                ],
            )
        )
        chats.append(("fresh", [{"role": "user", "content": request}]))
    return chats


def measure(args) -> dict:
    resolved = resolve_models(args.pair, args.model, args.draft_model)
    chats = conversations(args.prompts)
    totals = {(s, k): [0, 0, 0, 0, 0.0] for s in SOURCES for k in KINDS}
    by_source: dict[tuple[str, str], list[int]] = {}
    plain: list[list[int]] = []
    for source in SOURCES:
        if source == "hybrid" and resolved.draft is None:
            continue
        engine, loaded = build_engine(
            resolved,
            args.num_draft_tokens,
            no_draft=source == "none",
            draft="model" if source == "none" else source,
        )
        if source == "model" and engine.drafter is None:
            continue  # --model without --draft-model
        for i, (kind, messages) in enumerate(chats):
            prompt = encode_messages(loaded.tokenizer, messages)
            config = GenerationConfig(max_tokens=args.max_tokens)
            done = next(e for e in engine.generate(prompt, config) if isinstance(e, Done))
            if source == "none":
                plain.append(done.tokens)
            elif done.tokens != plain[i]:
                raise SystemExit(f"{source} differs from plain decoding on prompt {i} ({kind})")
            s = done.stats
            row = totals[source, kind]
            row[0] += s.generated_tokens
            row[1] += s.target_passes
            row[2] += s.draft_proposed
            row[3] += s.draft_accepted
            row[4] += s.decode_s
            for name, (proposed, accepted) in s.by_source.items():
                counts = by_source.setdefault((source, name), [0, 0])
                counts[0] += proposed
                counts[1] += accepted
    figures = {}
    for (source, kind), (tokens, passes, proposed, accepted, decode_s) in totals.items():
        if passes:
            figures[f"{source}/{kind}"] = {
                "tokens": tokens,
                "target_passes": passes,
                "tokens_per_pass": tokens / passes,
                "acceptance": accepted / proposed if proposed else None,
                "decode_tokens_per_s": tokens / decode_s if decode_s else None,
            }
    return {
        "target": resolved.target_name,
        "draft": resolved.draft_name,
        "num_draft_tokens": args.num_draft_tokens,
        "max_tokens": args.max_tokens,
        "prompts_per_kind": len(chats) // len(KINDS),
        "figures": figures,
        "by_source": {
            f"{s}:{n}": {"proposed": p, "accepted": a, "acceptance": a / p if p else None}
            for (s, n), (p, a) in by_source.items()
        },
    }


def table(result: dict) -> str:
    lines = [f"{'source/kind':<16}{'tokens':>8}{'passes':>8}{'tok/pass':>10}{'accept':>8}"]
    for name, f in result["figures"].items():
        accept = f"{f['acceptance']:.0%}" if f["acceptance"] is not None else "-"
        lines.append(
            f"{name:<16}{f['tokens']:>8}{f['target_passes']:>8}"
            f"{f['tokens_per_pass']:>10.2f}{accept:>8}"
        )
    for name, f in result["by_source"].items():
        accept = f"{f['acceptance']:.0%}" if f["acceptance"] is not None else "-"
        lines.append(f"  {name}: {f['accepted']}/{f['proposed']} kept ({accept})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default=None)
    parser.add_argument("--model", default=None)
    parser.add_argument("--draft-model", default=None)
    parser.add_argument(
        "-k",
        "--num-draft-tokens",
        default="4",
        help="the same fixed k for every source, for a fair comparison",
    )
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--prompts", type=int, default=8, help="functions (x3 kinds)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    if args.pair is None and args.model is None:
        args.pair = "demo"
    result = measure(args)
    print(table(result))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
