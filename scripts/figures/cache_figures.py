"""Tokens per target pass, acceptance and re-fed share on the hybrid / sliding-window / recurrent
fixtures of tests/test_caches.py (tiny random models from mlx-lm's classes), at k = 4 and auto.

    python scripts/figures/cache_figures.py

Every greedy output is checked against mlx-lm's target-only greedy (generate_step) as it goes.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

import tiny  # noqa: E402
from losslesskit import PROMPTS, reference, tally  # noqa: E402

from macspec.engine.drafters.model import ModelDrafter  # noqa: E402
from macspec.engine.generate.loop import Engine  # noqa: E402
from macspec.engine.policy.length import AutoPolicy, FixedPolicy  # noqa: E402

MAX_TOKENS = 32
PAIRS = {
    "qwen3_5 hybrid, hybrid draft": ("qwen3_5", lambda t: tiny.noisy_arch_copy(t, 0.02, 1)),
    "qwen3_5 hybrid, attention draft": ("qwen3_5", lambda t: tiny.unrelated_llama(t)),
    "gemma3_text sliding window 12": ("gemma3_text", lambda t: tiny.noisy_arch_copy(t, 0.02, 1)),
    "mamba2 recurrent": ("mamba2", lambda t: tiny.noisy_arch_copy(t, 0.02, 1)),
}


def main() -> None:
    folder = Path(tempfile.mkdtemp())
    tiny.write_tokenizer(folder)
    tok = tiny.tokenizer(folder)
    prompts = [tok.encode(p) for p in PROMPTS]
    print(f"{len(prompts)} prompts, {MAX_TOKENS} tokens, greedy")
    print("| fixture | k | acceptance | tokens per target pass | re-fed share | identical |")
    print("| --- | --- | --- | --- | --- | --- |")
    for label, (kind, make_draft) in PAIRS.items():
        target = tiny.arch_model(kind, 0, scale=3.0)
        draft = make_draft(target)
        wants = [reference(target, p, MAX_TOKENS) for p in prompts]
        for k in ("4", "auto"):
            policy = AutoPolicy() if k == "auto" else FixedPolicy(int(k))
            engine = Engine(target, tok, ModelDrafter(draft), policy)
            t = tally(engine, prompts, wants, MAX_TOKENS)
            print(
                f"| {label} | {k} | {t.acceptance} | {t.generated / t.passes:.2f} | "
                f"{t.refed / t.fed:.1%} | {t.identical}/{len(prompts)} |"
            )


if __name__ == "__main__":
    main()
