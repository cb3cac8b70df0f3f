"""`macspec run`: one prompt, streamed to stdout, stats on stderr."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer

from macspec.cli import options as opt
from macspec.cli.app import app, fail
from macspec.models.catalog import resolve_models

if TYPE_CHECKING:
    from macspec.engine.events import Done


def read_prompt(prompt: str) -> str:
    text = sys.stdin.read() if prompt == "-" else prompt
    if not text.strip():
        fail("the prompt is empty")
    return text


@app.command()
def run(
    prompt: Annotated[str, typer.Argument(help="The prompt; '-' reads it from stdin.")],
    model: opt.Model = None,
    draft_model: opt.DraftModel = None,
    pair: opt.PairName = None,
    temp: opt.Temp = 0.0,
    top_p: opt.TopP = 1.0,
    top_k: opt.TopK = 0,
    min_p: opt.MinP = 0.0,
    max_tokens: opt.MaxTokens = 256,
    seed: opt.Seed = None,
    num_draft_tokens: opt.NumDraftTokens = None,
    no_draft: opt.NoDraft = False,
    draft: opt.DraftSource = None,
    stop: opt.Stop = None,
    raw: Annotated[
        bool, typer.Option("--raw", help="Feed the prompt as is, no chat template.")
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object with ids, sources and stats.")
    ] = False,
) -> None:
    """Answer one prompt with speculative decoding, streaming the text as it comes."""
    # MLX and mlx-lm load here, not at import: `macspec --help` stays instant.
    from macspec.engine.events import Done, Token
    from macspec.engine.loop import GenerationConfig
    from macspec.engine.sampling import SamplingParams
    from macspec.engine.stats import summary_line
    from macspec.models.build import build_engine, needs_draft_model
    from macspec.models.templates import encode_prompt

    text = read_prompt(prompt)
    config = GenerationConfig(
        max_tokens=max_tokens,
        sampling=SamplingParams(temperature=temp, top_p=top_p, top_k=top_k, min_p=min_p),
        stop_strings=tuple(stop or ()),
        seed=seed,
    )
    resolved = resolve_models(
        pair, model, draft_model, need_draft=needs_draft_model(draft, no_draft)
    )
    engine, loaded = build_engine(resolved, num_draft_tokens, no_draft, draft)
    for warning in loaded.warnings:
        print(f"macspec: warning: {warning}", file=sys.stderr)
    prompt_ids = encode_prompt(loaded.tokenizer, text, raw=raw)

    done: Done | None = None
    for event in engine.generate(prompt_ids, config):
        if isinstance(event, Token) and not as_json:
            sys.stdout.write(event.text)
            sys.stdout.flush()
        elif isinstance(event, Done):
            done = event
    assert done is not None
    if as_json:
        print(json.dumps(run_record(done, prompt_ids, resolved, engine)))
        return
    sys.stdout.write(done.tail + ("\n" if not (done.text.endswith("\n")) else ""))
    sys.stdout.flush()
    print(summary_line(done.stats, done.finish_reason), file=sys.stderr)


def run_record(done: Done, prompt_ids: list[int], resolved, engine) -> dict[str, Any]:
    """The stable --json schema that other tools and our benchmarks parse."""
    return {
        "model": resolved.target_name,
        "draft_model": resolved.draft_name if engine.drafter is not None else None,
        "drafter": engine.drafter.name if engine.drafter is not None else None,
        "pair": resolved.pair.name if resolved.pair is not None else None,
        "prompt_tokens": prompt_ids,
        "tokens": done.tokens,
        "sources": [s.value for s in done.sources],
        "text": done.text,
        "finish_reason": done.finish_reason,
        "stats": done.stats.to_dict(),
    }
