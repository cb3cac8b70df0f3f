"""Helpers for the prompt cache's tests: tiny pairs of every cache type, engines bound to a disk
tier with small blocks, and a command line for the tests that need other processes
(`python tests/prefixkit.py run|ready-run ROOT KIND [PROMPT_SEED]`)."""

from __future__ import annotations

import sys
from pathlib import Path

import tiny
from losslesskit import done_of

from macspec import prefix
from macspec.engine.drafters.model import ModelDrafter
from macspec.engine.generate.loop import Engine, GenerationConfig
from macspec.engine.policy.length import FixedPolicy
from macspec.prefix.settings import DiskCacheSettings, Identity

BLOCK = 16
"""Small blocks, so prompts of a few dozen ids span several."""
MAX_TOKENS = 8
KINDS = ["llama", "qwen3_5", "gemma3_text", "mamba2"]
"""Full attention, the Gated DeltaNet hybrid, the sliding window (12 ids), pure recurrent."""


def pair(kind: str):
    """(target, draft): a tiny model of `kind` and a noisy copy of it."""
    if kind == "llama":
        target = tiny.random_model(0, scale=3.0)
        return target, tiny.noisy_copy(target, 0.02, seed=1)
    target = tiny.arch_model(kind, 0, scale=3.0)
    return target, tiny.noisy_arch_copy(target, 0.02, seed=1)


def settings(root: Path, gb: float = 1.0, state_every: int = 2, **kwargs) -> DiskCacheSettings:
    return DiskCacheSettings(gb=gb, folder=root, block=BLOCK, state_every=state_every, **kwargs)


def identities(kind: str) -> dict[str, prefix.Identity]:
    return {
        "target model": Identity(f"{kind}-target".ljust(64, "0"), f"tiny {kind}"),
        "draft model": Identity(f"{kind}-draft".ljust(64, "0"), f"tiny {kind} draft"),
    }


def engine(tok, target, draft, root: Path, kind: str, **kwargs) -> Engine:
    """A fresh engine (as a new process has) bound to the disk tier at `root`."""
    made = Engine(target, tok, ModelDrafter(draft), FixedPolicy(3))
    prefix.attach(made, identities(kind), settings(root, **kwargs))
    return made


def answer(made: Engine, prompt: list[int], max_tokens: int = MAX_TOKENS, ending: bool = True):
    """The Done of a generation from the longest cached prefix; then, as the process ends
    (`ending`), what the tier held in memory and queued is written."""
    done = done_of(prefix.generate(made, prompt, GenerationConfig(max_tokens=max_tokens)))
    tier = prefix.tier_of(made)
    if ending:
        tier.drain()
    else:
        tier.writer.drain()
    return done


def ids(seed: int, n: int, start: int = 0) -> list[int]:
    """A deterministic prompt of n ids."""
    return [(i * 7 + seed * 13 + start) % 250 for i in range(n)]


def rows_files(root: Path) -> list[Path]:
    return sorted(root.rglob("*.rows.safetensors"))


def main(argv: list[str]) -> None:
    """A process of its own: answer one prompt on a tiny model with the disk tier at ROOT,
    and print the answer's ids and how many prompt ids came from disk."""
    command, root, kind, *rest = argv
    assert command in ("run", "ready-run")
    seed = int(rest[0]) if rest else 0
    folder = Path(root) / "tokenizer"
    folder.mkdir(parents=True, exist_ok=True)
    tiny.write_tokenizer(folder)
    tok = tiny.tokenizer(folder)
    target, draft = pair(kind)
    made = engine(tok, target, draft, Path(root), kind)
    if command == "ready-run":  # say so, and start when told (a line on stdin)
        print("ready", flush=True)
        sys.stdin.readline()
    done = answer(made, ids(seed, 75))
    print(" ".join(map(str, done.tokens)), done.stats.disk_tokens, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
