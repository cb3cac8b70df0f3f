"""Blocking host-device waits per cycle on the demo pair, by configuration: what decides
speed on an Apple GPU (each wait idles it), counted here on any machine.

    python scripts/figures/count_waits.py                 # this checkout
    python scripts/figures/count_waits.py --code /path  # another macspec checkout, for before/after

A read (mx.eval, .item(), .tolist()) counts when a model's forward pass was queued since the
last read. `auto` runs with a GPU-like cost curve (a pass over m ids costs one), so it keeps
drafting as it would on a Mac; its draft is the demo's, confident enough for its floor mostly.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = [
    "Write a Python function `is_even(n)`: Return True if n is even.",
    "Write a Python function `flatten(items)`: Flatten a list of lists into one list.",
    "Write a Python method `Stack.push(self, item)`: Push an item on the stack.",
]


def module(*names: str):
    """The first of these modules that imports (the package moved between versions)."""
    for name in names:
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise ImportError(names)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--code", type=Path, default=ROOT, help="a macspec checkout to measure")
    parser.add_argument("--max-tokens", type=int, default=96)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(args.code))

    import mlx.core as mx
    from mlx_lm import load

    loop = module("macspec.engine.generate.loop", "macspec.engine.loop", "macspec.engine")
    drafters = module(
        "macspec.engine.drafters.model", "macspec.engine.drafters", "macspec.drafters"
    )
    lookup = module("macspec.engine.drafters.lookup", "macspec.engine.lookup", "macspec.lookup")
    policy = module("macspec.engine.policy.length", "macspec.engine.policy", "macspec.policy")
    sampling = module("macspec.engine.core.sampling", "macspec.engine.sampling", "macspec.sampling")
    cycle_type = module(
        "macspec.engine.core.cycle", "macspec.engine.core.events", "macspec.events"
    ).Cycle
    policy.AutoPolicy.pass_time = lambda self, m: 1.0  # an Apple GPU's flat curve
    demo = ROOT / "macspec" / "demo"
    target, tok = load(str(demo / "target"))
    draft, _ = load(str(demo / "draft"))

    counts = {"waits": 0, "queued": False}

    def reading(read):
        def wrapped(*a, **k):
            if counts["queued"]:
                counts["waits"] += 1
                counts["queued"] = False
            return read(*a, **k)

        return wrapped

    def queued(call):
        def forward(model, *a, **k):
            out = call(model, *a, **k)
            counts["queued"] = True
            return out

        return forward

    type(target).__call__ = queued(type(target).__call__)
    mx.eval = reading(mx.eval)
    mx.array.item = reading(mx.array.item)
    mx.array.tolist = reading(mx.array.tolist)

    configs = {
        "model k=4": lambda: (drafters.ModelDrafter(draft), policy.FixedPolicy(4)),
        "model auto": lambda: (drafters.ModelDrafter(draft), policy.AutoPolicy()),
        "lookup k=4": lambda: (lookup.LookupDrafter(), policy.FixedPolicy(4)),
        "hybrid k=4": lambda: (
            lookup.HybridDrafter(drafters.ModelDrafter(draft)),
            policy.FixedPolicy(4),
        ),
    }
    print(f"code: {args.code}")
    print("| configuration | T | waits per cycle | cycles | tokens per cycle |")
    print("| --- | --- | --- | --- | --- |")
    for label, make in configs.items():
        for temp in (0.0, 0.7):
            waits = cycles = tokens = 0
            for i, text in enumerate(PROMPTS):
                drafter, pol = make()
                engine = loop.Engine(target, tok, drafter, pol)
                ids = tok.apply_chat_template(
                    [{"role": "user", "content": text}], add_generation_prompt=True
                )
                config = loop.GenerationConfig(
                    max_tokens=args.max_tokens, sampling=sampling.SamplingParams(temp), seed=i
                )
                started = None
                for event in engine.generate(ids, config):
                    if isinstance(event, cycle_type):
                        if started is None:
                            started = counts["waits"]  # prefill's waits are not a cycle's
                        cycles += 1
                    elif hasattr(event, "tokens"):
                        tokens += len(event.tokens)
                waits += counts["waits"] - started
            print(
                f"| {label} | {temp:g} | {waits / cycles:.2f} | {cycles} | {tokens / cycles:.2f} |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
