"""Figures of batched speculation (`macspec serve --max-batch`), on a pair (the demo by default):

1. the engine: c requests at once (c = 1, 2, 4, 8), macspec's BatchEngine beside mlx-lm's
   `batch_generate` (plain), aggregate tokens per second and per CPU-second of this process,
   tokens and rows per target pass, every row checked against mlx-lm's output;
2. the server: c openai clients at once against `serve --max-batch 8` and `--max-batch 1`,
   each request's answer checked against the pair's own greedy answer; aggregate tokens per
   second and per CPU-second (client threads included: they run in this process);
3. on paper, a Mac: the cost model of a pass over m ids, T(m) = max(weights / bandwidth,
   m x flops per id / peak flops), and the aggregate tokens per second it predicts for plain
   batching and for batched speculation at a given acceptance.

    python scripts/figures/batch_figures.py [--pair demo] [--max-tokens 64] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

import openai
from rich.console import Console

from macspec.bench.concurrency import levels_json, render_levels, run_levels
from macspec.engine.generate.loop import GenerationConfig
from macspec.models.build import batch_engine_for, load_for_drafting
from macspec.models.catalog import resolve_models
from macspec.models.pairs import open_pair
from macspec.models.templates import encode_messages, encode_prompt
from macspec.serve.backend import Backend, Defaults
from macspec.serve.server import ServerThread

EVAL = Path(__file__).parents[1] / "demo_eval_prompts.jsonl"
LEVELS = (1, 2, 4, 8)


def prompts_of(count: int) -> list[str]:
    lines = EVAL.read_text().splitlines()[:count]
    return [json.loads(line)["prompt"] for line in lines]


def server_level(resolved, texts, clients: int, max_batch: int, max_tokens: int, want):
    opened = open_pair(resolved, "3", batch=max_batch > 1)
    backend = Backend(
        opened.engine,
        opened.tokenizer,
        "pair",
        defaults=Defaults(max_tokens=max_tokens),
        k=3,
        max_batch=max_batch,
    )
    answers: dict[int, str] = {}
    with ServerThread(backend) as server:
        api = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=600)

        def ask(i: int) -> None:
            messages = [{"role": "user", "content": texts[i % len(texts)]}]
            reply = api.chat.completions.create(model="pair", messages=messages)
            answers[i] = reply.choices[0].message.content

        wall, cpu = time.perf_counter(), time.process_time()
        threads = [threading.Thread(target=ask, args=(i,)) for i in range(clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    tokens = sum(
        len(opened.tokenizer.encode(a, add_special_tokens=False)) for a in answers.values()
    )
    same = all(answers[i] == want[i % len(texts)] for i in answers)
    return {"clients": clients, "max_batch": max_batch, "tokens_per_s": tokens / wall,
            "tokens_per_cpu_s": tokens / cpu, "same": same}  # fmt: skip


def mac_estimate(weights_gb: float, bandwidth: float, tflops: float, params_b: float,
                 acceptance: float, k: int) -> list[dict]:  # fmt: skip
    """Aggregate tokens per second a roofline cost model predicts for B rows, plain and with
    k guesses per row kept at `acceptance` each."""

    def pass_s(m: int) -> float:
        return max(weights_gb / bandwidth, m * 2 * params_b / (tflops * 1e3))

    per_row = sum(acceptance**i for i in range(k + 1))  # expected tokens per row per pass
    out = []
    for rows in LEVELS:
        plain = rows / pass_s(rows)
        spec = rows * per_row / pass_s(rows * (k + 1))
        out.append({"rows": rows, "plain_tok_s": plain, "speculative_tok_s": spec})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="demo")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    console = Console()
    resolved = resolve_models(args.pair, None, None)
    texts = prompts_of(8)

    loaded, kind, spec = load_for_drafting(resolved, "3", False, None)
    ids = [encode_prompt(loaded.tokenizer, t) for t in texts]
    levels = run_levels(
        lambda: batch_engine_for(loaded, kind, spec), loaded.target, loaded.tokenizer, ids,
        LEVELS, args.max_tokens,
    )  # fmt: skip
    render_levels(levels, console)

    alone = open_pair(resolved, "3").engine
    want = []
    for text in texts:
        prompt = encode_messages(loaded.tokenizer, [{"role": "user", "content": text}])
        want.append(list(alone.generate(prompt, GenerationConfig(args.max_tokens)))[-1].text)
    served = []
    for clients in LEVELS:
        for max_batch in (8, 1):
            served.append(server_level(resolved, texts, clients, max_batch, args.max_tokens, want))
            row = served[-1]
            console.print(
                f"serve --max-batch {max_batch}, {clients} clients: {row['tokens_per_s']:.1f} "
                f"tok/s, {row['tokens_per_cpu_s']:.1f} per CPU-s, same answers: {row['same']}"
            )
    # Qwen3.6-27B 4-bit on an M3 Max: ~15 GB of weights, ~400 GB/s, ~28 fp16 TFLOPS.
    mac = mac_estimate(15.0, 400.0, 28.0, 27.0, acceptance=0.7, k=3)
    for row in mac:
        console.print(
            f"on paper, 27B 4-bit, M3 Max, {row['rows']} rows: plain {row['plain_tok_s']:.0f} "
            f"tok/s, speculating (k=3, 0.7 kept) {row['speculative_tok_s']:.0f} tok/s"
        )
    if args.json:
        record = {"engine": levels_json(levels), "serve": served, "mac_estimate": mac}
        args.json.write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
