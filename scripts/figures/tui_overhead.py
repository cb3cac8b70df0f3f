"""Does the chat UI slow generation? Decode tok/s of the demo pair in the Textual app, run
headless (Pilot), against the bare engine on the same prompts; interleaved, median of each.

    python scripts/figures/tui_overhead.py [--prompts 6] [--max-tokens 128]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


async def in_app(engine, tok, prompts, max_tokens) -> list[float]:
    from macspec.chat.store import Store
    from macspec.engine.generate.loop import GenerationConfig
    from tui.factory import make_app

    rates = []
    store = Store(Path(tempfile.mkdtemp()) / "chats.db")
    app = make_app(engine, tok, store=store, config=GenerationConfig(max_tokens=max_tokens))
    async with app.run_test(size=(120, 40)) as pilot:
        for text in prompts:
            app.session.new_conversation()
            ended = app.turns_ended
            app.prompt.text = text
            await pilot.press("enter")
            while app.turns_ended == ended:
                await pilot.pause(0.05)
            await app.workers.wait_for_complete()
            stats = store.get(app.session.conversation_id).messages[-1].stats
            rates.append(stats["decode_tokens_per_s"])
    return rates


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from macspec.engine.generate.loop import GenerationConfig
    from macspec.models.build import build_engine
    from macspec.models.catalog import resolve_models
    from macspec.models.templates import encode_prompt

    prompts = [
        json.loads(line)["prompt"]
        for line in (ROOT / "scripts" / "demo_eval_prompts.jsonl").read_text().splitlines()
    ][: args.prompts]
    engine, loaded = build_engine(resolve_models("demo", None, None), "3")
    tok = loaded.tokenizer
    bare, app = [], []
    for text in prompts:  # interleaved: the same drift for both
        done = list(
            engine.generate(encode_prompt(tok, text), GenerationConfig(max_tokens=args.max_tokens))
        )[-1]
        bare.append(done.stats.decode_tokens_per_s)
        app += asyncio.run(in_app(engine, tok, [text], args.max_tokens))
    b, a = statistics.median(bare), statistics.median(app)
    print(f"bare engine: {b:.1f} tok/s (median of {len(bare)})")
    print(f"headless chat app: {a:.1f} tok/s (median of {len(app)})")
    print(f"app / bare: {a / b:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
