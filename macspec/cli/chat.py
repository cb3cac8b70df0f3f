"""`macspec chat` (the Textual chat UI) and `macspec history` (stored conversations)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from macspec.chat.store import (
    Conversation,
    ConversationSummary,
    Store,
    default_database_path,
    existing_database,
)
from macspec.cli import options as opt
from macspec.cli.app import app, fail
from macspec.cli.store_params import say_draft_choice, with_store_params
from macspec.errors import EXIT_USER_ERROR, QuietExit
from macspec.models.catalog import resolve_models


@app.command()
def chat(
    ctx: typer.Context,
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
    resume: Annotated[
        int | None,
        typer.Option("--resume", "-r", help="Continue the stored conversation with this id."),
    ] = None,
    continue_last: Annotated[
        bool, typer.Option("--continue", "-c", help="Continue the latest conversation.")
    ] = False,
) -> int:
    """Chat in the terminal; accepted draft guesses are shown in their own colour.

    With no model named, the default pair (the shipped demo pair until you choose another
    in config.toml). Conversations are saved in the macspec home (see `macspec history`).
    Keys: Enter sends, ctrl+j new line, Esc stops the answer, ctrl+p pairs, ctrl+n new
    chat, ctrl+r past chats, ctrl+t source colours, ctrl+s saves again what storage
    refused, ctrl+q quits. An answer stops at the context window (finish reason 'context').
    """
    from macspec.cli.ranks import refuse_under_launch

    refuse_under_launch("chat")
    # Every check that loads nothing heavy first: a bad flag or id is one line at once.
    from macspec.models.flags import check_draft_flags, needs_draft_model
    from macspec.models.templates import template_args

    if resume is not None and continue_last:
        fail("--resume and --continue both given; pass one of them")
    check_draft_flags(num_draft_tokens, no_draft, draft, draft_tree)  # -k 0, contradictions
    args = template_args(think, chat_template_args)  # a bad JSON
    config = opt.generation_config(
        max_tokens, temp, top_p, top_k, min_p, stop, seed, sampler, prefill_step_size
    )
    config = opt.with_grammar(config, json_schema, regex, grammar)
    caches = opt.cache_options(kv_bits, kv_group_size, quantized_kv_start, max_kv_size)
    disk = opt.disk_cache(disk_cache_gb, disk_cache_dir)
    store = Store()
    notes: list[str] = []
    conversation_id = store.latest_conversation_id() if continue_last else resume
    if conversation_id is not None:
        store.get(conversation_id)  # unknown or unreadable
    elif continue_last:
        notes.append("there is no stored conversation to continue; this is a new one")
    resolved = resolve_models(
        pair, model, draft_model, need_draft=needs_draft_model(draft, no_draft)
    )
    opt.gguf_layout(gguf_layout, resolved)
    config = with_store_params(config, resolved, ctx)  # an Ollama model's params, unless flagged
    say_draft_choice(resolved)
    require_terminal()
    what = resolved.pair.name if resolved.pair is not None else resolved.target_name
    # Said before mlx-lm loads (seconds): the user sees at once that something happens.
    print(f"macspec: loading {what}…", file=sys.stderr, flush=True)
    from macspec.chat.session import open_models
    from macspec.cli.gguf_notes import gguf_loading

    with gguf_loading():
        loaded = open_models(
            resolved, num_draft_tokens, no_draft, draft, caches, draft_tree=draft_tree,
            disk_cache=disk,
        )  # fmt: skip

    from macspec.models.templates import unused_template_options
    from tui.factory import default_pair_loader, make_app  # textual only when the UI runs

    chat_app = make_app(
        loaded.engine,
        loaded.tokenizer,
        store=store,
        models=loaded.models,
        config=config,
        context_length=loaded.context_length,
        conversation_id=conversation_id,
        load_pair=default_pair_loader(num_draft_tokens, no_draft, draft, caches, draft_tree, disk),
        warnings=[
            *loaded.warnings,
            *notes,
            *unused_template_options(loaded.tokenizer, system, think),
        ],
        system_prompt=system,
        template_args=args,
        exit_on_signals=True,
    )
    chat_app.run()
    settle_mlx()
    saved = report_unsaved(chat_app.session)
    if saved and chat_app.session.conversation_id is not None:
        say(
            f"macspec: conversation {chat_app.session.conversation_id} saved "
            f"(macspec chat --resume {chat_app.session.conversation_id})"
        )
    if chat_app.exit_signal is not None:  # said, as the chat ended
        raise QuietExit(128 + chat_app.exit_signal)
    return 0 if saved else EXIT_USER_ERROR


def require_terminal() -> None:
    """The chat is a full-screen app: without a terminal on stdin and stdout it would wait for
    keys that never come (and write its screen into a file)."""
    for name in ("stdin", "stdout"):
        stream = getattr(sys, name)
        if not (stream is not None and stream.isatty()):
            fail(
                f"macspec chat needs a terminal, and {name} is not one; for a prompt from a "
                "pipe or a script, use `macspec run` (or `macspec serve`)"
            )


def settle_mlx() -> None:
    """Wait for work MLX still has queued before the process exits. An answer cut short (a
    signal, a closed terminal) can leave a step in flight on MLX's own threads, and tearing
    those down mid-task at exit aborts the process (SIGABRT instead of 128+n)."""
    import mlx.core as mx

    mx.synchronize()


def say(line: str) -> None:
    """A line on stderr; after a hangup there may be no terminal left to write to."""
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:
        pass


def report_unsaved(session) -> bool:
    """At the end of a chat: save what storage refused before; what still cannot be saved
    goes to a file in a temp folder, and stderr says exactly what it holds. True when
    everything is saved."""
    from macspec.chat.journal import describe_unsaved, rescue, rescue_record

    if session.save_pending() is None:
        return True
    unsaved = session.journal.unsaved
    problem = str(session.journal.problem)
    say(f"macspec: error: {problem}")
    say(f"macspec: {len(unsaved)} messages could not be saved:")
    for line in describe_unsaved(unsaved):
        say(f"  {line}")
    try:
        path = rescue(unsaved, session.store.path, problem)
    except OSError as exc:  # the temp folder is full or read-only too: print them
        say(f"macspec: cannot write them to a temp folder either ({exc}); here they are:")
        say(json.dumps(rescue_record(unsaved, session.store.path, problem), indent=2))
        return False
    say(f"macspec: they are in {path}")
    return False


# ---- macspec history ----------------------------------------------------------------------

history_app = typer.Typer(
    help="List stored conversations; `history show ID` prints one.",
    invoke_without_command=True,
    no_args_is_help=False,
)
app.add_typer(history_app, name="history")

AsJson = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def _when(timestamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(timestamp))


def _summary_json(summary: ConversationSummary) -> dict[str, Any]:
    return {
        "id": summary.id,
        "title": summary.title,
        "created_at": summary.created_at,
        "updated_at": summary.updated_at,
        "message_count": summary.message_count,
        "pair": summary.models.pair,
        "target": summary.models.target,
        "draft": summary.models.draft,
    }


def _conversation_json(conversation: Conversation) -> dict[str, Any]:
    record = _summary_json(conversation.summary)
    record["messages"] = [
        {
            "id": m.id,
            "role": m.role,
            "content": m.content,
            "reasoning": m.reasoning,
            "complete": m.complete,
            "token_count": m.token_count,
            "finish_reason": m.finish_reason,
            "stats": m.stats,
            "pair": m.models.pair,
            "target": m.models.target,
            "draft": m.models.draft,
            "created_at": m.created_at,
        }
        for m in conversation.messages
    ]
    return record


@history_app.callback()
def history(
    ctx: typer.Context,
    as_json: AsJson = False,
    export: Annotated[
        Path | None,
        typer.Option(
            "--export",
            help="Write every conversation that can still be read to FILE as JSON ('-': "
            "stdout); works on a damaged database too, and writes nothing to it.",
            metavar="FILE",
        ),
    ] = None,
) -> None:
    """List stored conversations, latest first (ids for `macspec chat --resume ID`)."""
    if ctx.invoked_subcommand is not None:
        return
    if export is not None:
        export_history(export)
        return
    # Listing writes nothing: a home with no database yet has no conversations.
    conversations = Store().list_conversations() if existing_database() else []
    if as_json:
        typer.echo(json.dumps([_summary_json(c) for c in conversations], indent=2))
        return
    if not conversations:
        typer.echo("no stored conversations yet (start one with `macspec chat`)")
        return
    table = Table(title="macspec conversations", title_justify="left")
    # Only models and title give way on a narrow terminal; ids and dates stay whole.
    table.add_column("id", justify="right", no_wrap=True, min_width=2)
    table.add_column("updated", no_wrap=True, min_width=16)
    table.add_column("msgs", justify="right", no_wrap=True, min_width=4)
    table.add_column("models", max_width=32)
    table.add_column("title", min_width=10)
    for c in conversations:
        # Cells that do not wrap in columns that may shrink: one line each, cut with "…".
        cut = {"no_wrap": True, "overflow": "ellipsis"}
        table.add_row(
            str(c.id),
            _when(c.updated_at),
            str(c.message_count),
            Text(c.models.label, **cut),
            Text(c.title, **cut),
        )
    Console().print(table)


def export_history(target: Path) -> None:
    """`history --export FILE`: what can be read, as `history show --json` records."""
    from macspec.chat.export import export_readable

    database = existing_database()
    if database is None:
        fail(f"{default_database_path()}: no chat database to export")
    result = export_readable(database)
    text = json.dumps(result.conversations, indent=2) + "\n"
    if str(target) == "-":
        sys.stdout.write(text)
    else:
        try:
            target.write_text(text, encoding="utf-8")
        except OSError as exc:
            fail(f"{target}: cannot write the export: {exc.strerror or exc}")
    where = "stdout" if str(target) == "-" else str(target)
    lost = f"; {result.unreadable} rows could not be read" if result.unreadable else ""
    if result.uncounted:
        lost += "; more rows may be lost (where the damage is, ids cannot be counted)"
    print(
        f"macspec: exported {len(result.conversations)} conversations "
        f"({result.message_count} messages) from {database} to {where}{lost}",
        file=sys.stderr,
    )


@history_app.command("show")
def show(
    conversation_id: Annotated[int, typer.Argument(help="A conversation id from `history`.")],
    as_json: AsJson = False,
) -> None:
    """Print one stored conversation."""
    if existing_database() is None:  # nothing to show, and nothing created
        fail(f"no conversation with id {conversation_id} (no conversations stored yet)")
    conversation = Store().get(conversation_id)
    if as_json:
        typer.echo(json.dumps(_conversation_json(conversation), indent=2))
        return
    summary = conversation.summary
    console = Console(highlight=False)
    console.print(
        f"[bold]#{summary.id} {summary.title}[/bold]  "
        f"({summary.models.label}, {_when(summary.created_at)})",
        markup=True,
    )
    for message in conversation.messages:
        console.print()
        label = "you" if message.role == "user" else message.role
        if message.role == "assistant":
            state = [f"{message.token_count or 0} tokens", message.finish_reason or "?"]
            if not message.complete:
                state.append("incomplete")
            label += f" ({', '.join(state)})"
        console.print(f"[bold]{label}:[/bold]", markup=True)
        if message.reasoning:
            console.print(Text(message.reasoning, style="dim"))
            console.print()
        console.print(message.content, markup=False)
