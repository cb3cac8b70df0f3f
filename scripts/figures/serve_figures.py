"""Figures of `macspec serve` on a pair (the demo pair by default), through the real openai client:

- time to first token of a conversation's first turn against its second turn (cached prefix);
- requests per second for one client, one request after another;
- the load test: 16 clients x 4 turns at once, every answer checked against the pair's own greedy
  answer (computed beforehand by an engine of its own), latency percentiles, memory;
- 429s when the queue is small (--max-queue 2), 16 requests at once.

    python scripts/figures/serve_figures.py [--pair demo] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from pathlib import Path

import openai

from macspec.bench.prompts import GROUNDED
from macspec.chat.session import open_models
from macspec.engine.generate.loop import GenerationConfig
from macspec.models.catalog import resolve_models
from macspec.models.templates import encode_messages
from macspec.serve.backend import Backend, Defaults
from macspec.serve.server import ServerThread

EVAL = Path(__file__).parents[1] / "demo_eval_prompts.jsonl"
SYSTEM = "You are a careful Python programmer. Answer with code only, no explanations."
FOLLOW_UP = "Now write the same function again, with a docstring."


def rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def stream_turn(api, model: str, messages, max_tokens: int) -> tuple[float, str, dict]:
    """(client-side seconds to the first content token, answer, macspec figures + prompt size)."""
    started, first, text, figures = time.perf_counter(), None, [], {}
    for chunk in api.chat.completions.create(
        model=model,
        messages=messages,
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True},
    ):
        delta = chunk.choices[0].delta.content if chunk.choices else None
        if delta and first is None:
            first = time.perf_counter() - started
        text.append(delta or "")
        figures = (chunk.model_extra or {}).get("macspec") or figures
        if chunk.usage is not None:
            figures = {**figures, "prompt_tokens": chunk.usage.prompt_tokens}
    return first or 0.0, "".join(text), figures


def ttft_turns(api, model: str, prompts: list[str], max_tokens: int) -> dict:
    rows = []
    for text in prompts:
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]
        t1, answer, f1 = stream_turn(api, model, messages, max_tokens)
        messages.append({"role": "assistant", "content": answer})
        messages.append({"role": "user", "content": FOLLOW_UP})
        t2, _, f2 = stream_turn(api, model, messages, max_tokens)
        rows.append((t1, f1, t2, f2))

    def median(values) -> float:
        return round(statistics.median(values), 2)

    return {
        "conversations": len(rows),
        "first_turn_ttft_ms": median(1000 * r[0] for r in rows),
        "first_turn_prompt_tokens": median(r[1]["prompt_tokens"] for r in rows),
        "first_turn_prefilled": median(r[1]["prefilled_tokens"] for r in rows),
        "second_turn_ttft_ms": median(1000 * r[2] for r in rows),
        "second_turn_prompt_tokens": median(r[3]["prompt_tokens"] for r in rows),
        "second_turn_prefilled": median(r[3]["prefilled_tokens"] for r in rows),
    }


def sequential(api, model: str, prompts: list[str], max_tokens: int) -> dict:
    started, tokens = time.perf_counter(), 0
    accepted = proposed = 0
    for text in prompts:
        reply = api.chat.completions.create(
            model=model, messages=[{"role": "user", "content": text}], max_tokens=max_tokens
        )
        tokens += reply.usage.completion_tokens
        figures = reply.model_extra["macspec"]
        accepted += figures["draft_accepted"]
        proposed += figures["draft_proposed"]
    elapsed = time.perf_counter() - started
    return {
        "requests": len(prompts),
        "requests_per_s": len(prompts) / elapsed,
        "tokens_per_s": tokens / elapsed,
        "acceptance": accepted / proposed if proposed else None,
    }


def load_test(server, expected, model: str, clients: int, turns: int, max_tokens: int) -> dict:
    prompts = [json.loads(line)["prompt"] for line in EVAL.read_text().splitlines()][:clients]
    want: dict[int, list[str]] = {}
    for i, text in enumerate(prompts):  # each conversation's answers, by an engine of its own
        history, want[i] = [], []
        for j in range(turns):
            history.append({"role": "user", "content": text if j == 0 else FOLLOW_UP})
            ids = encode_messages(expected.tokenizer, history)
            done = list(expected.engine.generate(ids, GenerationConfig(max_tokens)))[-1]
            want[i].append(done.text)
            history.append({"role": "assistant", "content": done.text})

    got = {i: [] for i in range(clients)}
    latencies: list[float] = []
    errors: list[str] = []
    barrier = threading.Barrier(clients)

    def converse(i: int) -> None:
        api = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=600)
        history = []
        barrier.wait()
        try:
            for j in range(turns):
                history.append({"role": "user", "content": prompts[i] if j == 0 else FOLLOW_UP})
                started = time.perf_counter()
                reply = api.chat.completions.create(
                    model=model, messages=history, max_tokens=max_tokens
                )
                latencies.append(time.perf_counter() - started)
                got[i].append(reply.choices[0].message.content)
                history.append({"role": "assistant", "content": got[i][-1]})
        except Exception as exc:  # counted below
            errors.append(repr(exc))

    before = rss_mib()
    started = time.perf_counter()
    threads = [threading.Thread(target=converse, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    cache = server.backend.worker.prompt_cache
    return {
        "clients": clients,
        "turns": turns,
        "requests": clients * turns,
        "answered": sum(len(v) for v in got.values()),
        "errors": errors,
        "all_equal_greedy": got == want,
        "seconds": elapsed,
        "requests_per_s": clients * turns / elapsed,
        "latency_p50_s": pct(latencies, 0.5),
        "latency_p95_s": pct(latencies, 0.95),
        "rss_growth_mib": rss_mib() - before,
        "prompt_cache_hits": cache.hits,
        "prompt_cache_entries": len(cache.entries),
    }


def small_queue(server, model: str, requests: int, max_queue: int) -> dict:
    worker = server.backend.worker
    worker.max_queue, previous = max_queue, worker.max_queue
    statuses: list[int] = []
    barrier = threading.Barrier(requests)

    def one(i: int) -> None:
        api = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=600)
        barrier.wait()
        try:
            api.chat.completions.create(
                model=model, messages=[{"role": "user", "content": f"q {i}"}], max_tokens=32
            )
            statuses.append(200)
        except openai.APIStatusError as exc:
            statuses.append(exc.status_code)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(requests)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    worker.max_queue = previous
    return {
        "requests": requests,
        "max_queue": max_queue,
        "ok": statuses.count(200),
        "429": statuses.count(429),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="demo")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args()

    resolved = resolve_models(args.pair, None, None)
    loaded = open_models(resolved)
    expected = open_models(resolved)  # an engine of its own for the reference answers
    backend = Backend(
        loaded.engine,
        loaded.tokenizer,
        args.pair,
        context_length=loaded.context_length,
        defaults=Defaults(max_tokens=64),
        k=resolved.pair.draft_policy,
    )
    grounded = [p.text for p in GROUNDED]
    demo = [json.loads(line)["prompt"] for line in EVAL.read_text().splitlines()][16:40]
    figures: dict = {"pair": args.pair, "machine": os.uname().machine}
    with ServerThread(backend) as server:
        api = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=600)
        sequential(api, args.pair, demo[:2], 16)  # warm-up
        figures["ttft"] = ttft_turns(api, args.pair, demo[:12], 48)
        figures["ttft_grounded"] = ttft_turns(api, args.pair, grounded, 48)
        figures["sequential"] = sequential(api, args.pair, demo, 64)
        figures["load"] = load_test(server, expected, args.pair, 16, 4, 32)
        figures["queue"] = small_queue(server, args.pair, 16, 2)
    print(json.dumps(figures, indent=2))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
