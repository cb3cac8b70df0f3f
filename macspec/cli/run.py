"""`macspec run`: one prompt, streamed to stdout, stats on stderr."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from macspec.cli import options as opt
from macspec.cli.answer_output import (
    ReasoningWriter,
    StdoutFailed,
    silence_stdout,
    stdout_failed,
)
from macspec.cli.app import app, fail
from macspec.cli.notice import DelayedNotice
from macspec.cli.store_params import say_draft_choice, with_store_params
from macspec.errors import (
    EMPTY_PROMPT,
    EXIT_INCOMPLETE,
    EXIT_INTERRUPTED,
    QuietExit,
    is_empty_prompt,
)
from macspec.models.catalog import context_length, resolve_models
from macspec.models.hub import display_name

if TYPE_CHECKING:
    from macspec.engine.core.events import Done
    from macspec.engine.generate.loop import GenerationConfig
    from macspec.models.catalog import ResolvedModels


def read_prompt(prompt: str) -> str:
    """The prompt argument, or stdin for '-' (its trailing newlines dropped, as a shell's
    `$(...)` does: `echo` adds one the user did not type); bytes that are not text are one
    line."""
    given = read_stdin() if prompt == "-" else prompt
    text = given.rstrip("\r\n") if prompt == "-" else given
    if "\x00" in text:
        fail("the prompt holds binary data (NUL bytes); give text")
    if is_empty_prompt(text):  # whitespace is content (a raw continuation); nothing is not
        why = ""
        if prompt == "-":
            why = " (stdin gave no text)" if not given else " (stdin gave only line ends)"
        fail(EMPTY_PROMPT + why)
    return text


def read_stdin() -> str:
    """All of stdin as UTF-8 text."""
    buffer = getattr(sys.stdin, "buffer", None)
    if buffer is None:  # a text stream (tests)
        return sys.stdin.read()
    data = buffer.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        fail(
            f"stdin is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); "
            "give a text prompt"
        )


@app.command()
def run(
    ctx: typer.Context,
    prompt: Annotated[str, typer.Argument(help="The prompt; '-' reads it from stdin.")],
    model: opt.Model = None,
    draft_model: opt.DraftModel = None,
    pair: opt.PairName = None,
    temp: opt.Temp = 0.0,
    top_p: opt.TopP = 1.0,
    top_k: opt.TopK = 0,
    min_p: opt.MinP = 0.0,
    max_tokens: opt.MaxTokens = opt.DEFAULT_MAX_TOKENS,
    seed: opt.Seed = None,
    num_draft_tokens: opt.NumDraftTokens = None,
    no_draft: opt.NoDraft = False,
    draft: opt.DraftSource = None,
    draft_tree: opt.DraftTree = None,
    stop: opt.Stop = None,
    raw: Annotated[
        bool, typer.Option("--raw", help="Feed the prompt as is, no chat template.")
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object with ids, sources and stats.")
    ] = False,
    think: opt.Think = None,
    system: opt.System = None,
    chat_template_args: opt.ChatTemplateArgs = None,
    sampler: opt.Sampler = None,
    kv_bits: opt.KvBits = None,
    kv_group_size: opt.KvGroupSize = 64,
    quantized_kv_start: opt.QuantizedKvStart = 0,
    max_kv_size: opt.MaxKvSize = None,
    prefill_step_size: opt.PrefillStepSize = 2048,
    disk_cache_gb: opt.DiskCacheGb = 10.0,
    disk_cache_dir: opt.DiskCacheDir = None,
    gguf_layout: opt.GgufLayout = None,
    json_schema: opt.JsonSchema = None,
    regex: opt.Regex = None,
    grammar: opt.GrammarFile = None,
) -> int:
    """Answer one prompt with speculative decoding, streaming the text as it comes.

    The answer ends at an end-of-sequence token ('stop'), a --stop text ('stop_string'),
    --max-tokens ('length') or the model's context window ('context'); the stats line on
    stderr ends with which. A prompt longer than the context is refused; Ctrl-C ends the
    answer with a stats line saying 'interrupted' (exit 130).
    """
    # Nothing heavy loads at import: `macspec --help` stays instant; mlx-lm loads in answer().
    from macspec.cli.ranks import ranks
    from macspec.models.flags import check_draft_flags, needs_draft_model
    from macspec.models.templates import template_args

    text = read_prompt(prompt)
    template_flags = [
        flag
        for flag, value in (
            ("--system", system),
            ("--think" if think else "--no-think", think),
            ("--chat-template-args", chat_template_args),
        )
        if value is not None
    ]
    if raw and template_flags:
        fail(
            f"--raw sends the prompt without the chat template, which {template_flags[0]} "
            "needs; pass one or the other"
        )
    args = template_args(think, chat_template_args)
    check_draft_flags(num_draft_tokens, no_draft, draft, draft_tree)  # before any model loads
    config = opt.generation_config(
        max_tokens, temp, top_p, top_k, min_p, stop, seed, sampler, prefill_step_size
    )
    config = opt.with_grammar(config, json_schema, regex, grammar)
    caches = opt.cache_options(kv_bits, kv_group_size, quantized_kv_start, max_kv_size)
    disk = opt.disk_cache(disk_cache_gb, disk_cache_dir)
    resolved = resolve_models(
        pair, model, draft_model, need_draft=needs_draft_model(draft, no_draft)
    )
    opt.gguf_layout(gguf_layout, resolved)
    config = with_store_params(config, resolved, ctx)  # an Ollama model's params, unless flagged
    say_draft_choice(resolved)
    # Under mlx.launch every rank answers (the target sharded over them); rank 0 alone writes.
    with ranks() as here:
        where = {} if here is None else {"group": here.group, "watchdog": here.watchdog}
        return answer(
            text, config, resolved, (num_draft_tokens, no_draft, draft, caches, draft_tree), where,
            raw, system, think, args, as_json, disk,
        )  # fmt: skip


def answer(
    text: str, config: GenerationConfig, resolved: ResolvedModels, engine_args: tuple,
    where: dict[str, Any], raw: bool, system: str | None, think: bool | None, args: dict,
    as_json: bool, disk=None,
) -> int:  # fmt: skip
    """Load, encode, generate and write one answer (stdout), stats on stderr; the exit code."""
    import mlx.core as mx

    from macspec.cli.gguf_notes import gguf_loading
    from macspec.engine.core.events import Done, Prefill, Token
    from macspec.engine.core.stats import summary_line
    from macspec.models.build import build_engine
    from macspec.models.reasoning import ReasoningSplitter, reasoning_start
    from macspec.models.templates import (
        encode_prompt,
        has_chat_template,
        unused_template_options,
    )
    from macspec.prefix.tier import attach_pair, generate

    *drafting, draft_tree = engine_args
    with gguf_loading() as gguf:
        engine, loaded = build_engine(resolved, *drafting, **where, draft_tree=draft_tree)
    if disk is not None and not where:  # a sharded target's caches are not stored
        attach_pair(engine, resolved, disk)
        show_warnings()
    unused = [] if raw else unused_template_options(loaded.tokenizer, system, think)
    for warning in [*loaded.warnings, *unused]:
        print(f"macspec: warning: {warning}", file=sys.stderr)
    prompt_ids = encode_prompt(loaded.tokenizer, text, raw=raw, system=system, args=args)
    context = context_length(resolved)
    opt.check_fits(len(prompt_ids), context, resolved.target_name)
    # The answer stops at the context ('context'); a raw prompt's answer continues its text.
    continuation = raw or not has_chat_template(loaded.tokenizer)
    config = replace(config, context_length=context, continuation=continuation)
    inside = reasoning_start(loaded.tokenizer, prompt_ids)
    splitter = ReasoningSplitter(inside) if inside is not None else None
    out = ReasoningWriter(sys.stdout, dim=sys.stdout.isatty())

    done: Done | None = None
    tally = Tally(len(prompt_ids))
    events = generate(engine, prompt_ids, config)  # from the longest prefix cached on disk
    notice = DelayedNotice()  # 'reading the prompt' while a long one is prefilled
    try:
        for event in events:
            tally.add(event)
            if isinstance(event, Prefill):
                if event.prompt_tokens > event.cached_tokens:
                    fresh = event.prompt_tokens - event.cached_tokens
                    notice.start(f"reading the prompt: {fresh:,} ids…")
                continue
            notice.stop()
            if isinstance(event, Token):
                split = splitter.feed(event.text) if splitter is not None else None
                if not as_json:
                    out.write(event.text if split is None else split)
            elif isinstance(event, Done):
                done = event
    except (KeyboardInterrupt, StdoutFailed) as exc:
        notice.stop()  # before the stats line below
        events.close()
        mx.synchronize()  # a step may be in flight on MLX's threads: not torn down at exit
        if isinstance(exc, StdoutFailed):
            stdout_failed(exc)
        interrupted(tally, out, as_json)  # Ctrl-C: end the line, then the stats so far
    finally:
        notice.stop()  # whatever ended the answer: no spinner left behind
    assert done is not None
    # Text held back until the end (a possible stop string, a possible tag), split too.
    ending = [done.tail] if splitter is None else [splitter.feed(done.tail), splitter.flush()]
    cut = cut_before_complete(done, config)
    code = 0 if cut is None else EXIT_INCOMPLETE
    try:
        if as_json:
            record = run_record(done, prompt_ids, resolved, engine)
            record["gguf"] = [conversion.to_json() for conversion in gguf]
            if splitter is not None:  # the answer and the reasoning apart (--max-tokens: both)
                record.update(text=splitter.answer, reasoning=splitter.reasoning.rstrip("\n"))
            if config.grammar is not None:
                record.update(grammar_complete=cut is None, incomplete=cut)
            out.emit_line(json.dumps(record))
            if cut is not None:
                print(f"macspec: {cut}", file=sys.stderr)
            return code
        for part in ending:
            out.write(part)
        out.close()
        if not out.ends_with_newline:
            out.emit_line("")
    except StdoutFailed as exc:
        stdout_failed(exc)
    say_price(done, resolved)  # before the stats line, which stays the last
    print(summary_line(done.stats, done.finish_reason), file=sys.stderr)
    if not done.tokens and done.finish_reason == "stop":
        hint = " (--raw sends the prompt without the chat template)" if raw else ""
        print(f"macspec: the model ended its answer immediately{hint}", file=sys.stderr)
    if cut is not None:
        print(f"macspec: {cut}", file=sys.stderr)
    return code


def say_price(done: Done, resolved: ResolvedModels) -> None:
    """The draft length's cost model, measured over this answer, when it says speculation
    loses with the draft the user named (not for one macspec chose: nothing to act on)."""
    note = done.stats.price_note
    if note is not None and not resolved.draft_chosen_for_you:
        print(f"macspec: warning: {note} (a smaller draft, or --no-draft)", file=sys.stderr)


GRAMMAR_NAMES = {"json_schema": "JSON schema", "json": "JSON", "regex": "regex", "lark": "grammar"}
CUT_AT = {"length": "--max-tokens", "context": "the model's context window",
          "stop_string": "a --stop text", "cancelled": "a cancel"}  # fmt: skip


def cut_before_complete(done: Done, config: GenerationConfig) -> str | None:
    """Why a constrained answer does not match its grammar, in one line; None when it does
    (only the end of sequence that the grammar's mask allowed ends it complete)."""
    grammar = config.grammar
    if grammar is None or done.finish_reason == "stop":
        return None
    where = CUT_AT.get(done.finish_reason, done.finish_reason)
    if done.finish_reason == "length":
        where += f" ({config.max_tokens})"
    name = GRAMMAR_NAMES.get(grammar.kind, grammar.kind)
    outcome = "it is not valid JSON" if grammar.kind.startswith("json") else "it does not match"
    return f"the answer was cut at {where} before the {name} was complete: {outcome}"


def show_warnings() -> None:
    """The prompt cache's warnings (a damaged block dropped, a full disk) and the engine's (a
    drafter that failed and was switched off) as macspec's own warning lines on stderr."""
    import logging

    class Stderr(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            print(f"macspec: warning: {record.getMessage()}", file=sys.stderr)

    for name in ("macspec.prefix", "macspec.engine"):
        logger = logging.getLogger(name)
        if not any(type(h).__name__ == "Stderr" for h in logger.handlers):
            logger.addHandler(Stderr(logging.WARNING))


class Tally:
    """The stats of a generation as its events come, for when it never reaches its Done."""

    def __init__(self, prompt_tokens: int):
        from macspec.engine.core.stats import Stats

        self.stats = Stats(prompt_tokens=prompt_tokens)
        self.text: list[str] = []
        self._started = time.perf_counter()
        self._first: float | None = None

    def add(self, event) -> None:
        from macspec.engine.core.events import Cycle, Token

        if isinstance(event, Cycle):
            self.stats.add_cycle(event)
        elif isinstance(event, Token):
            now = time.perf_counter()
            self._first = now if self._first is None else self._first
            self.stats.steady_tokens = self.stats.generated_tokens  # all after the first
            self.stats.generated_tokens += 1
            self.stats.ttft_s = self._first - self._started
            self.stats.decode_s = now - self._first
            self.text.append(event.text)


def interrupted(tally: Tally, out: ReasoningWriter, as_json: bool) -> NoReturn:
    """Ctrl-C mid-answer: a newline after the text so far, a stats line saying 'interrupted'
    on stderr (or the JSON record so far), exit 130."""
    from macspec.engine.core.stats import summary_line

    try:
        if as_json:
            record = {"text": "".join(tally.text), "finish_reason": "interrupted"}
            out.emit_line(json.dumps({**record, "stats": tally.stats.to_dict()}))
        else:
            out.close()
            out.emit_line("")
    except StdoutFailed:  # Ctrl-C in a terminal stops the reader of a pipe too: still 130
        silence_stdout()
    print(summary_line(tally.stats, "interrupted"), file=sys.stderr)
    raise QuietExit(EXIT_INTERRUPTED)  # said: not 'macspec: interrupted' again


def run_record(done: Done, prompt_ids: list[int], resolved, engine) -> dict[str, Any]:
    """The stable --json schema that other tools and our benchmarks parse."""
    return {
        "model": display_name(resolved.target_name),
        "draft_model": display_name(resolved.draft_name) if engine.drafter is not None else None,
        "drafter": engine.drafter.name if engine.drafter is not None else None,
        "sampler": done.stats.sampler,
        "pair": resolved.pair.name if resolved.pair is not None else None,
        "ranks": getattr(engine, "size", 1),
        "prompt_tokens": prompt_ids,
        "tokens": done.tokens,
        "sources": [s.value for s in done.sources],
        "text": done.text,
        "reasoning": None,
        "finish_reason": done.finish_reason,
        "stats": done.stats.to_dict(),
    }
