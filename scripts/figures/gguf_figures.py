"""GGUF figures on SmolLM2-135M-Instruct (Q4_1): prompt lookup and suffix drafting at k = 4
and 8 (acceptance, tokens per target pass, greedy output checked against plain decoding), and
loading the file against the same weights as an mlx-lm folder (time, peak memory), each load
in a fresh process.

    python scripts/figures/gguf_figures.py [--prompts N] [--max-tokens N] [--loads N]

The mlx-lm folder is written from `mx.load`'s arrays (llama.cpp's row order read by traditional
rope), as tests/ggufkit.py writes it. Prints one JSON object and a short table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

LOAD_ONE = """
import resource, sys, time
from mlx_lm import load
from macspec.models import hub
from macspec.models.loader import load_model
start = time.perf_counter()  # the load alone: both sides have imported the same modules
if sys.argv[1] == "gguf":
    model, tok = load_model(hub.local_model_path(sys.argv[2]), "model")
else:
    model, tok = load(sys.argv[2])
seconds = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
print(seconds, peak * (1 if sys.platform == "darwin" else 1024))
"""


def load_figures(gguf: Path, folder: Path, loads: int, home: str) -> dict:
    """Seconds and peak resident bytes of loading each, in fresh processes (min and median)."""
    env = {"MACSPEC_HOME": home, "PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    out = {}
    for kind, path in (("gguf", gguf), ("mlx_lm_folder", folder)):
        runs = []
        for _ in range(loads):
            done = subprocess.run(
                [sys.executable, "-c", LOAD_ONE, kind.split("_")[0], str(path)],
                capture_output=True,
                text=True,
                env=env,
                check=True,
            )
            seconds, peak = done.stdout.split()[-2:]
            runs.append((float(seconds), int(peak)))
        times, peaks = [r[0] for r in runs], [r[1] for r in runs]
        out[kind] = {
            "load_s_min": min(times),
            "load_s_median": statistics.median(times),
            "peak_rss_mb_median": statistics.median(peaks) / 1e6,
        }
    return out


def drafting_figures(gguf: Path, count: int, max_tokens: int, configs) -> list[dict]:
    from macspec.bench.prompts import GROUNDED, builtin
    from macspec.engine.drafters.suffix import SaidTokens
    from macspec.engine.generate.loop import Engine, GenerationConfig
    from macspec.engine.policy.length import FixedPolicy
    from macspec.models import hub
    from macspec.models.build import make_drafter
    from macspec.models.loader import LoadedModels, load_model

    folder = hub.local_model_path(str(gguf))
    target, tokenizer = load_model(folder, "model")
    loaded = LoadedModels(target=target, tokenizer=tokenizer, target_path=folder)
    grounded, others = list(GROUNDED), builtin()
    prompts = [*grounded[: (count + 1) // 2], *others[: count // 2]]  # both kinds, half each
    plain = Engine(target, tokenizer)
    config = GenerationConfig(max_tokens=max_tokens)
    rows = []
    ids = {}
    for prompt in prompts:
        turns = [{"role": "user", "content": prompt.text}]
        ids[prompt.name] = tokenizer.apply_chat_template(turns, add_generation_prompt=True)
    answers = {name: list(plain.generate(p, config))[-1].tokens for name, p in ids.items()}
    for kind, k in configs:
        # A fresh store of what was said: suffix drafting must not find earlier runs' answers.
        loaded.said = SaidTokens()
        engine = Engine(target, tokenizer, make_drafter(kind, loaded), FixedPolicy(k))
        proposed = accepted = passes = tokens = 0
        same = True
        for prompt in prompts:
            done = list(engine.generate(ids[prompt.name], config))[-1]
            same &= done.tokens == answers[prompt.name]
            stats = done.stats
            proposed += stats.draft_proposed
            accepted += stats.draft_accepted
            passes += stats.target_passes
            tokens += stats.generated_tokens
        row = {
            "draft": kind,
            "k": k,
            "proposed": proposed,
            "accepted": accepted,
            "acceptance": accepted / proposed if proposed else 0.0,
            "tokens_per_pass": tokens / passes if passes else 0.0,
            "identical_to_plain": same,
        }
        print(json.dumps(row), file=sys.stderr, flush=True)  # as it comes: runs are long
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--loads", type=int, default=3)
    parser.add_argument(
        "--configs",
        default="lookup:4,lookup:8,suffix:4,suffix:8",
        help="drafter:k, comma list (hybrid needs a draft model: none shares SmolLM2's "
        "tokenizer and is smaller)",
    )
    args = parser.parse_args()
    configs = [(kind, int(k)) for kind, k in (c.split(":") for c in args.configs.split(","))]
    from ggufkit import llama_reference_folder, smollm2_path

    gguf = smollm2_path()
    with tempfile.TemporaryDirectory() as scratch:
        home = str(Path(scratch) / "home")
        import os

        os.environ["MACSPEC_HOME"] = home
        folder = llama_reference_folder(gguf, Path(scratch) / "mlx-lm")
        # The reference folder's tokenizer: the one macspec derived from the same file.
        from macspec.models import hub

        derived = hub.local_model_path(str(gguf))
        for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
            if (derived / name).is_file():
                (folder / name).write_bytes((derived / name).read_bytes())
        loads = load_figures(gguf, folder, args.loads, home) if args.loads else {}
        print(json.dumps({"loads": loads}), file=sys.stderr, flush=True)  # as it comes
        drafting = (
            drafting_figures(gguf, args.prompts, args.max_tokens, configs) if args.prompts else []
        )
    result = {"model": gguf.name, "loads": loads, "drafting": drafting}
    print(json.dumps(result, indent=2))
    for kind, figures in loads.items():
        print(
            f"{kind:14} load {figures['load_s_median']:.2f} s (min {figures['load_s_min']:.2f}),"
            f" peak {figures['peak_rss_mb_median']:.0f} MB"
        )
    for row in drafting:
        print(
            f"{row['draft']:7} k={row['k']}: acceptance {row['acceptance']:.0%} of "
            f"{row['proposed']}, {row['tokens_per_pass']:.2f} tokens/pass, "
            f"identical {row['identical_to_plain']}"
        )


if __name__ == "__main__":
    main()
