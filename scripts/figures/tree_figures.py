"""Draft trees against chains at the same depth: tokens per target pass, per drafter, on the
fixtures of tests/ and on the demo pair.

    python scripts/figures/tree_figures.py                 # fixtures and the demo pair, greedy
    python scripts/figures/tree_figures.py --only demo --temps 0,0.7
    python scripts/figures/tree_figures.py --only eagle3 --temps 0,0.7  # EAGLE-3 heads
    python scripts/figures/tree_figures.py --only blocks --temps 0,0.7   # block marginals (DFlash)

Every greedy output is checked against mlx-lm's target-only greedy (generate_step); a seeded
sampled run (the coupled rule) against plain decoding with the same seed. One engine serves all
the prompts of a row, as in a chat: the tree's shape follows the acceptance by rank it has
measured so far. The block-drafter rows use marginals made from the target's own greedy
continuation, sharp or flat (no trained DFlash drafter exists for these targets): they show
how DDTree and the measured shape fare as the marginals sharpen.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "tests"))

import mlx.core as mx  # noqa: E402
import tiny  # noqa: E402
from losslesskit import PROMPTS, reference  # noqa: E402
from treekit import OracleBlock, TornBlock, mtp_head  # noqa: E402

from macspec.engine.core.sampling import SamplingParams  # noqa: E402
from macspec.engine.drafters.dflash import DFlashDrafter  # noqa: E402
from macspec.engine.drafters.eagle3 import Eagle3Drafter  # noqa: E402
from macspec.engine.drafters.model import ModelDrafter  # noqa: E402
from macspec.engine.drafters.mtp import MTPDrafter  # noqa: E402
from macspec.engine.generate.loop import Engine, GenerationConfig  # noqa: E402
from macspec.engine.policy.length import FixedPolicy  # noqa: E402
from macspec.engine.trees.sizing import make_tree_policy  # noqa: E402
from macspec.models.drafters import load_dflash  # noqa: E402
from macspec.models.eagle3 import load_eagle3  # noqa: E402


def measure(make_engine, prompts, wants, max_tokens, temp, sampler=None):
    """(tokens per pass, mean tree nodes, ' (n/m)' outputs identical to `wants`, or '' when
    there is nothing to compare with: the rejection rule). A fresh engine per prompt
    (an MTP or DFlash drafter kept across unrelated prompts can lose the hidden states of
    their shared prefix), sharing one tree policy and the acceptance by rank it measures."""
    decided = passes = nodes = cycles = same = 0
    for i, prompt in enumerate(prompts):
        engine = make_engine()
        config = GenerationConfig(
            max_tokens=max_tokens, sampling=SamplingParams(temperature=temp), seed=i,
            sampler=sampler if temp > 0 else None,
        )  # fmt: skip
        done = list(engine.generate(prompt, config))[-1]
        s = done.stats
        decided += s.generated_tokens + s.end_tokens
        passes += s.target_passes
        nodes += s.tree_nodes
        cycles += s.tree_cycles
        same += done.tokens == wants(i)
    checked = "" if wants(0) is None else f" ({same}/{len(prompts)})"
    return decided / passes, nodes / cycles if cycles else 0.0, checked


def rows_for(label, target, make_drafter, prompts, max_tokens, args, tok, vocab=None, force=None):
    """One table row per temperature and depth; `force`: a block drafter's trees are all
    DDTree (True) or all the measured shape (False), None: as the policy measures."""
    temps = [float(t) for t in args.temps.split(",")]
    depths = [int(d) for d in args.depths.split(",")]
    sizes = args.sizes.split(",")
    eos = frozenset(tok.eos_token_ids)
    greedy = [reference(target, p, max_tokens, eos) for p in prompts]
    plain = Engine(target, tok, vocab_size=vocab)
    for temp in temps:
        if temp == 0:
            wants = greedy.__getitem__
        elif args.sampler == "rejection":  # the same distribution, not the same tokens

            def wants(i):
                return None

        else:  # coupled: plain decoding with the same seed

            def wants(i, temp=temp):
                config = GenerationConfig(
                    max_tokens=max_tokens, sampling=SamplingParams(temperature=temp), seed=i
                )
                return list(plain.generate(prompts[i], config))[-1].tokens

        for depth in depths:
            cells = []
            for size in ("off", *sizes):
                policy = make_tree_policy(size, FixedPolicy(depth))
                if force is not None and size != "off":
                    policy._ddtree_next = lambda: force

                def engine(policy=policy):
                    return Engine(target, tok, make_drafter(), policy, vocab_size=vocab)

                tpp, mean, same = measure(engine, prompts, wants, max_tokens, temp, args.sampler)
                note = getattr(policy, "tree_note", None)
                cells.append(note or f"{tpp:.2f}{same}")
            print(f"| {label} | {temp:g} | {depth} | " + " | ".join(cells) + " |", flush=True)


def fixtures(root: Path, tok, args):
    prompts = [tok.encode(p) for p in PROMPTS]
    llama = tiny.random_model(0, scale=3.0)
    for noise in (0.03, 0.1):
        draft = tiny.noisy_copy(llama, noise, seed=3)
        label = f"llama, draft model (noisy copy {noise})"
        yield label, llama, lambda d=draft: ModelDrafter(d), None
    for arch in ("qwen3", "qwen3_5"):
        target = tiny.near_bigram(tiny.arch_model(arch, 0, scale=3.0), mix=0.02)
        head = mtp_head(target)
        yield f"{arch}, MTP head", target, lambda h=head, t=target: MTPDrafter(h, t), None
    qwen3 = tiny.arch_model("qwen3", 0, scale=3.0)
    folder = tiny.save_dflash_folder(root / "dflash", target_layer_ids=(0, 1))
    model = load_dflash(folder, tiny.CONFIGS[id(qwen3)])
    yield "qwen3, DFlash (random drafter)", qwen3, lambda: DFlashDrafter(model, qwen3), None
    answers = {tuple(p): reference(qwen3, p, args.max_tokens) for p in prompts}
    for sharp in (2.0, 5.0):
        for how in ("DDTree", "measured shape", "the better, measured"):

            def make(sharp=sharp):
                return OracleBlock(model, qwen3, answers, sharp)

            force = {"DDTree": True, "measured shape": False}.get(how)
            yield f"qwen3, block marginals {sharp:g} sharp, {how}", qwen3, make, force


def blocks(root: Path, tok, args):
    """Block drafters with known marginals, on the qwen3 fixture (`--only blocks`): sharp on
    the target's own tokens (5: always right, said to be about 0.25 likely), flat (2), and torn
    (a sharp marginal, or one torn between two ids, by a coin per position: where DDTree's
    per-block branching pays). Each grown as DDTree, as the measured shape, and as the policy
    chooses by what each kept."""
    prompts = [tok.encode(p) for p in PROMPTS]
    qwen3 = tiny.arch_model("qwen3", 0, scale=3.0)
    folder = tiny.save_dflash_folder(root / "dflash-blocks", target_layer_ids=(0, 1))
    model = load_dflash(folder, tiny.CONFIGS[id(qwen3)])
    answers = {tuple(p): reference(qwen3, p, args.max_tokens) for p in prompts}
    kinds = {
        "sharp 5": lambda: OracleBlock(model, qwen3, answers, 5.0),
        "flat 2": lambda: OracleBlock(model, qwen3, answers, 2.0),
        "torn": lambda: TornBlock(model, qwen3, answers),
    }
    for name, make in kinds.items():
        for how in ("DDTree", "measured shape", "the better, measured"):
            force = {"DDTree": True, "measured shape": False}.get(how)
            yield f"qwen3, block marginals {name}, {how}", qwen3, make, force


def eagle3_heads(root: Path):
    """EAGLE-3 heads made from near-bigram targets (tests/eagle3kit.py: 200 of 260 ids in the
    draft vocabulary), exact and noisy, on a llama and a qwen3."""
    import eagle3kit as kit

    taps = (0, 1, 3)
    for kind, make_target in (("llama", kit.llama_target), ("qwen3", kit.qwen3_target)):
        target = make_target()
        for noise in (0.0, 0.3):
            weights = kit.constructed(target, taps, noise=noise)
            folder = kit.save_folder(target, root / f"eagle3-{kind}-{noise}", weights, taps)
            head = load_eagle3(folder, kit.target_config(target))
            label = f"{kind}, EAGLE-3 head (noise {noise:g})"
            yield label, target, lambda h=head, t=target: Eagle3Drafter(h, t), None


def demo(args):
    from macspec.models.build import drafter_folders, load_drafters, make_drafter
    from macspec.models.catalog import resolve_models
    from macspec.models.templates import encode_prompt

    resolved = resolve_models("demo", None, None)
    loaded = load_drafters(resolved, drafter_folders(resolved, "auto"), {"model", "mtp"})
    lines = (HERE.parent / "demo_eval_prompts.jsonl").read_text().splitlines()[: args.n]
    prompts = [encode_prompt(loaded.tokenizer, json.loads(line)["prompt"]) for line in lines]
    for kind in ("model", "mtp"):
        yield f"demo, {kind}", loaded, prompts, lambda k=kind: make_drafter(k, loaded), None


def hybrid_pass_cost(repeats: int = 9) -> None:
    """A tree pass against a chain pass over as many ids, on attention and hybrid targets
    (8 layers, hidden 256): what branching the Gated DeltaNet state costs, level by level."""
    import time

    import numpy as np
    from mlx_lm.models.cache import make_prompt_cache

    from macspec.engine.caches import recurrent
    from macspec.engine.caches import tree_attention as treeattn
    from macspec.engine.trees.shapes import best_first
    from macspec.engine.trees.verdict import visibility

    size = dict(hidden_size=256, num_hidden_layers=8, intermediate_size=512, head_dim=32)
    size.update(num_attention_heads=8, num_key_value_heads=2)
    linear = dict(linear_num_value_heads=8, linear_num_key_heads=4)
    linear.update(linear_key_head_dim=32, linear_value_head_dim=32)
    print("| target | ids | tree levels | chain pass, ms | tree pass, ms | ratio |")
    print("| --- | --- | --- | --- | --- | --- |")
    for kind, extra in (("qwen3", {}), ("qwen3_5", linear)):
        model = tiny.arch_model(kind, 0, **size, **extra)
        recurrent.install(model)
        treeattn.install(model)
        prompt = mx.array(list(range(10, 138)))[None]
        for nodes, depth in ((16, 4), (32, 6)):
            shape = best_first([[0.6, 0.2, 0.1, 0.05]] * depth, nodes, depth)
            ancestry = np.eye(nodes, dtype=bool)
            for i, p in enumerate(shape.parents):
                ancestry[i] |= ancestry[p] if p >= 0 else False
            visible = visibility(mx.array(ancestry), 1)
            positions = mx.array([0, *shape.depths], mx.int32)
            parents = [-1] + [1 + p if p >= 0 else 0 for p in shape.parents]
            ids = mx.array([5] + [7] * nodes)[None]
            tree = (positions, visible, parents)
            times = {"chain": [], "tree": []}
            for _ in range(repeats):  # interleaved, each on a fresh prefilled cache
                for run in times:
                    cache = make_prompt_cache(model)
                    model(prompt, cache=cache)
                    mx.eval([c.state for c in cache])
                    start = time.perf_counter()
                    if run == "tree":
                        with treeattn.tree_pass(cache, *tree):
                            mx.eval(model(ids, cache=cache))
                    else:
                        mx.eval(model(ids, cache=cache))
                    times[run].append(time.perf_counter() - start)
            c, t = (1000 * float(np.median(times[r])) for r in ("chain", "tree"))
            print(f"| {kind} | {nodes + 1} | {shape.depth + 1} | {c:.1f} | {t:.1f} | {t / c:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    only = ("fixtures", "blocks", "eagle3", "demo", "hybrid-cost")
    parser.add_argument("--only", choices=only, default=None)
    parser.add_argument("--temps", default="0")
    parser.add_argument("--sampler", choices=("coupled", "rejection"), default=None)
    parser.add_argument("--depths", default="4")
    parser.add_argument("--sizes", default="8,16,32")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--demo-tokens", type=int, default=128)
    parser.add_argument("-n", type=int, default=20, help="demo prompts")
    args = parser.parse_args()
    if args.only == "hybrid-cost":
        hybrid_pass_cost()
        return
    sizes = args.sizes.split(",")
    print("tokens per target pass (outputs identical to the reference / prompts)")
    print("| drafter | T | depth | chain | " + " | ".join(f"tree {s}" for s in sizes) + " |")
    print("| --- | --- | --- | --- | " + " | ".join("---" for _ in sizes) + " |")
    root = Path(tempfile.mkdtemp())
    tiny.write_tokenizer(root / "tok")
    tok = tiny.tokenizer(root / "tok")
    prompts = [tok.encode(p) for p in PROMPTS]
    if args.only in (None, "fixtures"):
        for label, target, make, force in fixtures(root, tok, args):
            rows_for(label, target, make, prompts, args.max_tokens, args, tok, force=force)
    if args.only == "blocks":
        for label, target, make, force in blocks(root, tok, args):
            rows_for(label, target, make, prompts, args.max_tokens, args, tok, force=force)
    if args.only in (None, "eagle3"):
        for label, target, make, force in eagle3_heads(root):
            rows_for(label, target, make, prompts, args.max_tokens, args, tok, force=force)
    if args.only in (None, "demo"):
        for label, loaded, prompts, make, _ in demo(args):
            rows_for(
                label, loaded.target, make, prompts, args.demo_tokens, args, loaded.tokenizer,
                loaded.vocab_size,
            )  # fmt: skip


if __name__ == "__main__":
    main()
