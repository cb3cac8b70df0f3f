"""The chat as README shows it: `macspec chat -k 4` on the shipped demo pair, one question
answered, saved as the SVG Textual itself renders (App.save_screenshot).

    python scripts/figures/chat_screenshot.py                 # writes docs/images/chat.svg

The app is built as `macspec chat` builds it (open_models, make_app) and driven headless, in a
temporary macspec home, so no stored chat or prompt cache of yours is read or written. `-k 4`
rather than the default `auto`: on a CPU `auto` guesses little, and the screenshot is there to
show kept guesses in their own colour. Timings differ from run to run and machine to machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROMPT = (
    "Write a Python method `Misc.keys(self)`: Return a list of all resource names of this widget."
)


async def screenshot(out: Path, size: tuple[int, int], draft_tokens: str) -> None:
    from macspec.chat.session import open_models
    from macspec.chat.store import Store
    from macspec.cli import options as opt
    from macspec.engine.generate.loop import GenerationConfig
    from macspec.models.catalog import resolve_models
    from tui.factory import make_app

    resolved = resolve_models(None, None, None)  # the default pair: the shipped demo
    caches = opt.cache_options(None, 64, 0, None)
    loaded = open_models(resolved, draft_tokens, False, None, caches)
    app = make_app(
        loaded.engine,
        loaded.tokenizer,
        store=Store(),
        models=loaded.models,
        config=GenerationConfig(max_tokens=256),
        context_length=loaded.context_length,
        list_pairs=lambda: [],
    )
    async with app.run_test(size=size) as pilot:
        app.prompt.text = PROMPT
        await pilot.press("enter")
        deadline = time.monotonic() + 120
        while app.turns_ended < 1:
            if time.monotonic() > deadline:
                sys.exit("the answer did not end within 120 s")
            await pilot.pause(0.05)
        await app.workers.wait_for_complete()
        await pilot.pause(0.2)
        app.save_screenshot(filename=out.name, path=str(out.parent))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images" / "chat.svg")
    parser.add_argument("--columns", type=int, default=100)
    parser.add_argument("--lines", type=int, default=28)
    parser.add_argument("-k", "--num-draft-tokens", default="4")
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as home:
        os.environ["MACSPEC_HOME"] = home
        asyncio.run(screenshot(args.out, (args.columns, args.lines), args.num_draft_tokens))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
