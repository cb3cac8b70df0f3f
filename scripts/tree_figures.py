"""Draft trees against chains at the same depth: tokens per target pass, per drafter, on the
fixtures of tests/ and on the demo pair.

    python scripts/tree_figures.py                 # fixtures and the demo pair, greedy
    python scripts/tree_figures.py --only demo --temps 0,0.7

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
sys.path.insert(0, str(HERE.parent / "tests"))

import tiny  # noqa: E402
from losslesskit import PROMPTS, reference  # noqa: E402
from treekit import OracleBlock, mtp_head  # noqa: E402

from macspec.engine.dflash import DFlashDrafter  # noqa: E402
from macspec.engine.drafters import ModelDrafter  # noqa: E402
from macspec.engine.loop import Engine, GenerationConfig  # noqa: E402
from macspec.engine.mtp import MTPDrafter  # noqa: E402
from macspec.engine.policy import FixedPolicy  # noqa: E402
from macspec.engine.sampling import SamplingParams  # noqa: E402
from macspec.engine.treepolicy import make_tree_policy  # noqa: E402
from macspec.models.drafters import load_dflash  # noqa: E402


def measure(make_engine, prompts, wants, max_tokens, temp) -> tuple[float, float, str]:
    """(tokens per pass, mean tree nodes, outputs checked 'n/m'). A fresh engine per prompt
    (an MTP or DFlash drafter kept across unrelated prompts can lose the hidden states of
    their shared prefix), sharing one tree policy and the acceptance by rank it measures."""
    decided = passes = nodes = cycles = same = 0
    for i, prompt in enumerate(prompts):
        engine = make_engine()
        config = GenerationConfig(
            max_tokens=max_tokens, sampling=SamplingParams(temperature=temp), seed=i
        )
        done = list(engine.generate(prompt, config))[-1]
        s = done.stats
        decided += s.generated_tokens + s.end_tokens
        passes += s.target_passes
        nodes += s.tree_nodes
        cycles += s.tree_cycles
        same += done.tokens == wants(i)
    return decided / passes, nodes / cycles if cycles else 0.0, f"{same}/{len(prompts)}"


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

                tpp, mean, same = measure(engine, prompts, wants, max_tokens, temp)
                note = getattr(policy, "tree_note", None)
                cells.append(note or f"{tpp:.2f} ({same})")
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


def demo(args):
    from macspec.models.build import drafter_folders, load_drafters, make_drafter
    from macspec.models.catalog import resolve_models
    from macspec.models.templates import encode_prompt

    resolved = resolve_models("demo", None, None)
    loaded = load_drafters(resolved, drafter_folders(resolved, "auto"), {"model", "mtp"})
    lines = (HERE / "demo_eval_prompts.jsonl").read_text().splitlines()[: args.n]
    prompts = [encode_prompt(loaded.tokenizer, json.loads(line)["prompt"]) for line in lines]
    for kind in ("model", "mtp"):
        yield f"demo, {kind}", loaded, prompts, lambda k=kind: make_drafter(k, loaded), None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("fixtures", "demo"), default=None)
    parser.add_argument("--temps", default="0")
    parser.add_argument("--depths", default="4")
    parser.add_argument("--sizes", default="8,16,32")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--demo-tokens", type=int, default=128)
    parser.add_argument("-n", type=int, default=20, help="demo prompts")
    args = parser.parse_args()
    sizes = args.sizes.split(",")
    print("tokens per target pass (outputs identical to the reference / prompts)")
    print("| drafter | T | depth | chain | " + " | ".join(f"tree {s}" for s in sizes) + " |")
    print("| --- | --- | --- | --- | " + " | ".join("---" for _ in sizes) + " |")
    root = Path(tempfile.mkdtemp())
    tiny.write_tokenizer(root / "tok")
    tok = tiny.tokenizer(root / "tok")
    if args.only != "demo":
        prompts = [tok.encode(p) for p in PROMPTS]
        for label, target, make, force in fixtures(root, tok, args):
            rows_for(label, target, make, prompts, args.max_tokens, args, tok, force=force)
    if args.only != "fixtures":
        for label, loaded, prompts, make, _ in demo(args):
            rows_for(
                label, loaded.target, make, prompts, args.demo_tokens, args, loaded.tokenizer,
                loaded.vocab_size,
            )  # fmt: skip


if __name__ == "__main__":
    main()
