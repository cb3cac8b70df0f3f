"""A hybrid target's shared prefix after a restart (issue 44, item 3): two prompts to the tiny
Qwen3.5-style fixture of tests/ (Gated DeltaNet + attention) share their first `--shared` ids;
the first is answered by one process, the second by a fresh engine on the same folder (a
restart). Prints the ids the second reused from disk, the bytes each wrote (target and draft
model), the state files on disk, and whether each answer equals the target alone's.

    python scripts/figures/hybrid_prefix_figures.py [--shared 6138] [--first 8000] [--second 6600]
    python scripts/figures/hybrid_prefix_figures.py --sparse  # states at checkpoints only (before)

Blocks of 256 ids and a state checkpoint every 8th boundary, as `macspec serve` stores them.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

import tiny  # noqa: E402
from losslesskit import reference  # noqa: E402
from prefixkit import answer, identities, ids, pair  # noqa: E402

from macspec import prefix  # noqa: E402
from macspec.engine.drafters.model import ModelDrafter  # noqa: E402
from macspec.engine.generate.loop import Engine  # noqa: E402
from macspec.engine.policy.length import FixedPolicy  # noqa: E402
from macspec.prefix.settings import DiskCacheSettings  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", type=int, default=6138)
    parser.add_argument("--first", type=int, default=8000)
    parser.add_argument("--second", type=int, default=6600)
    parser.add_argument("--gb", type=float, default=10.0)
    parser.add_argument("--sparse", action="store_true", help="no states between checkpoints")
    parser.add_argument("--max-tokens", type=int, default=8)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp())
    tiny.write_tokenizer(root / "tok")
    tok = tiny.tokenizer(root / "tok")
    target, draft = pair("qwen3_5")
    shared = ids(1, args.shared)
    first = shared + ids(2, args.first - args.shared, start=100)
    second = shared + ids(3, args.second - args.shared, start=50)
    settings = DiskCacheSettings(gb=args.gb, folder=root / "cache", dense_states=not args.sparse)

    def engine() -> Engine:  # a new process: empty caches in memory
        made = Engine(target, tok, ModelDrafter(draft), FixedPolicy(3))
        prefix.attach(made, identities("qwen3_5"), settings)
        return made

    dense = "sparse" if args.sparse else "dense"
    print(
        f"prompts of {len(first)} and {len(second)} ids sharing {len(shared)}; block 256, "
        f"checkpoint every {settings.state_every}, states {dense}"
    )
    for name, prompt in (("first", first), ("second (after a restart)", second)):
        done = answer(engine(), prompt, args.max_tokens)
        same = done.tokens == reference(target, prompt, args.max_tokens)
        s = done.stats
        print(
            f"{name}: reused {s.disk_tokens} ids from disk, prefilled {s.prefilled_tokens}, "
            f"wrote {s.disk_written_bytes / 1e6:.2f} MB; equals the target alone: {same}"
        )
    for kind in ("rows", "state", "state-thin"):
        files = list((root / "cache").rglob(f"*.{kind}.safetensors"))
        size = sum(f.stat().st_size for f in files)
        print(f"{kind} files on disk: {len(files)}, {size / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
