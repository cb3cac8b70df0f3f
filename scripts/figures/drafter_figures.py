"""Acceptance and tokens per target pass for the drafters that read the target (MTP heads,
DFlash block drafters) on the fixtures of tests/test_hidden_drafters.py: tiny models from
mlx-lm's own classes, drafters written in the published formats and loaded from disk.

    python scripts/figures/drafter_figures.py

Every greedy output is checked against mlx-lm's target-only greedy (generate_step) as it goes.
The MTP fixtures are near-bigram targets with a head that mostly agrees with them, so their
acceptance is a property of the fixture, not of a trained head; DFlash's drafters are random.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402
import tiny  # noqa: E402
from losslesskit import PROMPTS, reference, tally  # noqa: E402

from macspec.engine.drafters.dflash import DFlashDrafter  # noqa: E402
from macspec.engine.drafters.lookup import LookupDrafter  # noqa: E402
from macspec.engine.drafters.mtp import MTPDrafter  # noqa: E402
from macspec.engine.generate.loop import Engine  # noqa: E402
from macspec.engine.policy.choice import DrafterChoice  # noqa: E402
from macspec.engine.policy.length import AutoPolicy, FixedPolicy  # noqa: E402
from macspec.models.drafters import load_dflash, load_mtp  # noqa: E402

MAX_TOKENS = 32


def mtp_fixture(kind: str, four_bit: bool, folder: Path):
    target = tiny.near_bigram(tiny.arch_model(kind, 0, scale=3.0), mix=0.02)
    bits = 4 if four_bit else None
    saved = tiny.save_mtp_folder(target, folder, noise=0.005, bits=bits)
    head = load_mtp(saved, tiny.CONFIGS[id(target)])
    if four_bit:
        nn.quantize(target, group_size=32, bits=4)
        mx.eval(target.parameters())
    return target, lambda: MTPDrafter(head, target)


def dflash_fixture(kind: str, folder: Path):
    target = tiny.arch_model(kind, 0, scale=3.0)
    saved = tiny.save_dflash_folder(folder, target_layer_ids=(0, 1))
    model = load_dflash(saved, tiny.CONFIGS[id(target)])
    return target, lambda: DFlashDrafter(model, target)


def policies(make_drafter):
    for k in (1, 2, 4):
        yield f"{k}", make_drafter(), FixedPolicy(k)
    yield "auto", make_drafter(), AutoPolicy()
    choice = DrafterChoice([make_drafter(), LookupDrafter()])
    yield "--draft auto", choice, choice


def main() -> None:
    root = Path(tempfile.mkdtemp())
    tiny.write_tokenizer(root / "tok")
    tok = tiny.tokenizer(root / "tok")
    prompts = [tok.encode(p) for p in PROMPTS]
    fixtures = {
        "MTP, qwen3_5 hybrid": lambda: mtp_fixture("qwen3_5", False, root / "m1"),
        "MTP, qwen3_5 hybrid 4-bit": lambda: mtp_fixture("qwen3_5", True, root / "m2"),
        "MTP, qwen3_5_moe": lambda: mtp_fixture("qwen3_5_moe", False, root / "m3"),
        "DFlash, qwen3 (random drafter)": lambda: dflash_fixture("qwen3", root / "d1"),
        "DFlash, qwen3_5 (random drafter)": lambda: dflash_fixture("qwen3_5", root / "d2"),
    }
    print(f"{len(prompts)} prompts, {MAX_TOKENS} tokens, greedy")
    print("| fixture | k | acceptance | tokens per target pass | identical |")
    print("| --- | --- | --- | --- | --- |")
    for label, build in fixtures.items():
        target, make_drafter = build()
        wants = [reference(target, p, MAX_TOKENS) for p in prompts]
        for k, drafter, policy in policies(make_drafter):
            t = tally(Engine(target, tok, drafter, policy), prompts, wants, MAX_TOKENS)
            print(
                f"| {label} | {k} | {t.acceptance} | {t.generated / t.passes:.2f} | "
                f"{t.identical}/{len(prompts)} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
