"""`macspec serve`: the OpenAI-compatible local server."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from macspec.cli import options as opt
from macspec.cli.app import app, fail
from macspec.cli.store_params import say_draft_choice, serve_defaults
from macspec.models.catalog import ResolvedModels, resolve_models
from macspec.models.hub import display_name

NO_CHAT_ROUTES = (
    "the model has no chat template: the chat routes (/v1/chat/completions, /v1/responses, "
    "/v1/messages, /api/chat) refuse requests; /v1/completions and /api/generate work"
)
"""Serve's start-up warning for a base model (run's and chat's is NO_TEMPLATE)."""


@app.command()
def serve(
    ctx: typer.Context,
    model: opt.Model = None,
    draft_model: opt.DraftModel = None,
    pair: opt.PairName = None,
    host: Annotated[
        str, typer.Option("--host", help="Address to listen on; beyond loopback needs --api-key.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to listen on (0: a free one).")] = 8080,
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key",
            envvar="MACSPEC_API_KEY",
            help="Require this key from clients (as a bearer token, or in x-api-key).",
        ),
    ] = None,
    insecure: Annotated[
        bool,
        typer.Option("--insecure", help="Allow a non-loopback --host without --api-key."),
    ] = False,
    max_queue: Annotated[
        int,
        typer.Option(
            "--max-queue",
            help="Requests that may wait for a place in the batch; more get a 429.",
        ),
    ] = 32,
    prompt_cache: Annotated[
        int,
        typer.Option(
            "--prompt-cache",
            help="Conversations whose caches are kept besides the latest one (0: only that).",
        ),
    ] = 4,
    max_batch: Annotated[
        int | None,
        typer.Option(
            "--max-batch",
            help="Requests decoded together, each exactly as it would be alone [default: 8; "
            "1 under mlx.launch]. 1: one at a time.",
        ),
    ] = None,
    any_model: Annotated[
        bool,
        typer.Option(
            "--any-model",
            help="Answer every model id with the served pair (agents send their own ids); "
            "each new id is logged once. Without it an unknown id is a 404.",
        ),
    ] = False,
    temp: opt.Temp = 0.0,
    top_p: opt.TopP = 1.0,
    top_k: opt.TopK = 0,
    min_p: opt.MinP = 0.0,
    max_tokens: Annotated[
        int, typer.Option("--max-tokens", help="Tokens per answer when a request does not say.")
    ] = opt.DEFAULT_MAX_TOKENS,
    num_draft_tokens: opt.NumDraftTokens = None,
    no_draft: opt.NoDraft = False,
    draft: opt.ServeDraftSource = None,
    draft_tree: opt.DraftTree = None,
    think: opt.Think = None,
    chat_template_args: opt.ChatTemplateArgs = None,
    disk_cache_gb: opt.DiskCacheGb = 10.0,
    disk_cache_dir: opt.DiskCacheDir = None,
    keep_alive: Annotated[
        str,
        typer.Option(
            "--keep-alive",
            help="Without --model: how long a model stays loaded after its last request "
            "(Ollama's keep_alive: '5m', '30s', 0, -1 for ever); a request's own wins.",
        ),
    ] = "5m",
    max_loaded_models: Annotated[
        int | None,
        typer.Option(
            "--max-loaded-models",
            help="Without --model: most models loaded at once; the least recently used idle "
            "one unloads first [default: as many as the memory budget holds].",
        ),
    ] = None,
    memory_budget: Annotated[
        float | None,
        typer.Option(
            "--memory-budget",
            metavar="GB",
            help="Without --model: memory the loaded models may take together (weights and a "
            "full-context KV cache each) [default: what this Mac gives models].",
        ),
    ] = None,
    context: Annotated[
        int | None,
        typer.Option(
            "--context-length",
            metavar="N",
            help="Most tokens per request, prompt and answer together (agents need 16k and "
            "more) [default: the pair's, else the target's max_position_embeddings].",
        ),
    ] = None,
) -> None:
    """Serve models over an OpenAI-compatible API, with speculative decoding.

    Without --model (or --pair): every model `macspec models` lists as runnable, each loaded
    when a request first names it (with the draft --draft-model auto pairs it with) and
    unloaded after --keep-alive, or to make room under --memory-budget and
    --max-loaded-models, as Ollama does. With --model: that one model, loaded at start.

    Routes: /v1/chat/completions and /v1/completions (OpenAI), /v1/responses (OpenAI's
    Responses API, Codex CLI), /v1/messages and /v1/messages/count_tokens (Anthropic's
    Messages API, Claude Code), /api/chat, /api/generate, /api/tags, /api/show, /api/ps and
    /api/version (Ollama's API: point OLLAMA_HOST at this server), /v1/models, /health. Tool
    calls are rendered and parsed in the model's own format. Up to --max-batch requests decode
    together; more wait in a bounded queue.

    Sampling flags are the defaults for requests that leave them out.

    Under `mlx.launch -n N -- python -m macspec serve …` the target is sharded over the N
    ranks: rank 0 serves, the others run each generation with it.
    """
    # MLX, mlx-lm, FastAPI and uvicorn load here, not at import: `macspec --help` stays instant.
    from macspec.cli.ranks import ranks
    from macspec.engine.core.sampling import SamplingParams
    from macspec.models.flags import check_draft_flags, needs_draft_model
    from macspec.models.templates import template_args
    from macspec.serve.backend import Defaults
    from macspec.serve.server import check_host

    check_host(host, api_key, insecure)
    check_draft_flags(num_draft_tokens, no_draft, draft, draft_tree)  # before any model loads
    if draft is None and not no_draft and num_draft_tokens is None:
        # Agents resend the conversation (tool results, files read back): lookup over it beside
        # the pair's drafters, whichever measures fastest on this machine, cycle by cycle.
        draft = "auto"
    if not 0 <= port <= 65535:
        fail(f"--port must be in 0..65535, got {port}")
    if max_queue < 0 or prompt_cache < 0:
        fail("--max-queue and --prompt-cache must be >= 0")
    if max_batch is not None and not 1 <= max_batch <= 64:
        fail(f"--max-batch must be between 1 and 64, got {max_batch}")
    if max_tokens < 1:
        fail(f"--max-tokens must be >= 1, got {max_tokens}")
    if context is not None and context < 2:
        fail(f"--context-length must be >= 2, got {context}")
    SamplingParams(temperature=temp, top_p=top_p, top_k=top_k, min_p=min_p)  # checks ranges
    args = template_args(think, chat_template_args)
    disk = opt.disk_cache(disk_cache_gb, disk_cache_dir)
    defaults = Defaults(temp, top_p, top_k, min_p, max_tokens, args)
    if model is None and pair is None:  # every model on this Mac, loaded on first request
        from macspec.cli.serve_pool import serve_pool

        if draft_model is not None or any_model:
            fail("--draft-model and --any-model go with a --model; without one, every model "
                 "on this Mac is served, each with the draft --draft-model auto finds")  # fmt: skip
        listen = (host, port, api_key, max_queue, prompt_cache, False, max_batch or 8, context)
        limits = (keep_alive, max_loaded_models, memory_budget)
        draft_args = (num_draft_tokens, no_draft, draft, draft_tree)
        serve_pool(ctx, draft_args, defaults, listen, disk, limits)
        return
    resolved = resolve_models(
        pair, model, draft_model, need_draft=needs_draft_model(draft, no_draft)
    )
    defaults = serve_defaults(defaults, resolved, ctx)  # an Ollama model's params, unless flagged
    say_draft_choice(resolved)
    # Under mlx.launch the target is sharded over every rank: rank 0 serves, the others follow.
    with ranks() as here:
        where = {} if here is None else {"group": here.group, "watchdog": here.watchdog}
        if where and max_batch is not None and max_batch > 1:
            fail(
                f"--max-batch {max_batch}: a target sharded over ranks decodes one request at a "
                "time; leave out --max-batch (or pass 1)"
            )
        max_batch = (1 if where else 8) if max_batch is None else max_batch
        served = serve_models(
            resolved, (num_draft_tokens, no_draft, draft, draft_tree), where, defaults,
            (host, port, api_key, max_queue, prompt_cache, any_model, max_batch, context), disk,
        )  # fmt: skip
    if served is not None:
        fail(f"{served}")


def serve_models(
    resolved, draft_args: tuple, where: dict, defaults, listen: tuple, disk=None
) -> BaseException | None:
    """Load, then serve until stopped (rank 0, or alone) or follow rank 0 (other ranks).
    Returns the error that stopped the server, if one did (a lost rank)."""
    import signal

    from macspec.cli.gguf_notes import gguf_loading
    from macspec.prefix.tier import attach_pair
    from macspec.serve.ranks import Leader, follow
    from macspec.serve.server import bind, run_server

    host, port, api_key, _, prompt_cache, _, max_batch, _ = listen
    serving = not where or where["group"].rank() == 0
    # The port first: a taken one is said at once, not after minutes of loading a big model.
    sock = bind(host, port) if serving else None
    print(f"macspec: loading {display_name(resolved.target_name)}…", file=sys.stderr, flush=True)
    try:
        with gguf_loading():
            loaded = open_batched(resolved, draft_args, where, max_batch)
        if not where and disk is not None:  # a sharded target's caches are not stored
            attach_pair(loaded.engine, resolved, disk)
    except BaseException:
        if sock is not None:
            sock.close()
        raise
    engine = loaded.engine
    leader = None
    if where:
        if where["group"].rank() != 0:
            # Ctrl-C in the terminal reaches every rank: rank 0 drains the requests in flight
            # (which need this rank's passes), then tells this one to stop.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            follow(engine, prompt_cache)
            return None
        leader = Leader(engine)
        leader.idle()
    backend = backend_for(resolved, loaded, draft_args[0], defaults, listen, leader)
    max_batch = backend.max_batch
    drafter = engine.drafter.name if engine.drafter is not None else "none"
    spread = f", target sharded over {where['group'].size()} ranks" if where else ""
    spread += f", up to {max_batch} requests at once" if max_batch > 1 else ""

    def announce(url: str) -> None:
        print(
            f"macspec: serving {backend.model_id} (drafts: {drafter}{spread}) at {url}; "
            "Ctrl-C stops",
            file=sys.stderr,
            flush=True,
        )

    run_server(backend, sock, host, api_key, announce)
    fatal = backend.worker.fatal
    if leader is not None and fatal is None:
        fatal = leader.stop()
    print("macspec: server stopped", file=sys.stderr)
    return fatal


def backend_for(
    resolved, loaded, num_draft_tokens, defaults, listen: tuple, leader=None, model_id=None
):
    """The Backend over a loaded pair, with the command's settings (its start-up warnings said
    on stderr); `model_id`: the id it is listed by (else the one `served_names` gives)."""
    from macspec.models.templates import has_chat_template
    from macspec.serve.backend import Backend

    _, _, _, max_queue, prompt_cache, any_model, max_batch, context = listen
    if max_batch > 1 and not hasattr(loaded.engine, "admit"):
        max_batch = 1  # open_batched said why, in one line
    for warning in loaded.warnings:
        print(f"macspec: warning: {warning}", file=sys.stderr)
    if not has_chat_template(loaded.tokenizer):  # said once here, not as a 400 per request
        print(f"macspec: warning: {NO_CHAT_ROUTES}", file=sys.stderr)
    named, aliases = served_names(resolved)
    k = num_draft_tokens or (resolved.pair.draft_policy if resolved.pair is not None else "auto")
    return Backend(
        loaded.engine,
        loaded.tokenizer,
        model_id or named,
        context_length=context_window(context, loaded.context_length),
        defaults=defaults,
        aliases=aliases,
        k=int(k) if str(k).isdigit() else k,
        max_queue=max_queue,
        prompt_cache_size=prompt_cache,
        leader=leader,
        any_model=any_model,
        max_batch=max_batch,
    )


def context_window(asked: int | None, model: int | None) -> int | None:
    """--context-length, else the model's own window; past the model's, a warning."""
    if asked is None:
        return model
    if model is not None and asked > model:
        print(
            f"macspec: warning: --context-length {asked} is beyond the model's {model} "
            "positions; answers past them may lose coherence",
            file=sys.stderr,
        )
    return asked


def open_batched(resolved, draft_args: tuple, where: dict, max_batch: int):
    """The pair, on an engine that batches requests when `max_batch` > 1 and the target's
    caches allow it (else one request at a time, said in one line)."""
    from macspec.models.pairs import open_pair

    num_draft_tokens, no_draft, draft, draft_tree = draft_args
    if max_batch > 1:
        try:
            return open_pair(
                resolved, num_draft_tokens, no_draft, draft, batch=True, draft_tree=draft_tree
            )
        except ValueError as exc:
            print(
                f"macspec: warning: {resolved.target_name}: {exc}; serving one request at a "
                "time (--max-batch 1)",
                file=sys.stderr,
            )
    return open_pair(resolved, num_draft_tokens, no_draft, draft, **where, draft_tree=draft_tree)


def served_names(resolved: ResolvedModels) -> tuple[str, tuple[str, ...]]:
    """The model id the APIs list (a pair's name; a GGUF file's model name without its folder,
    `.gguf` and split part's suffix, as Ollama lists it; else the name given) and the other names
    a request may use (an Ollama store model's own name among them, with and without
    `ollama:`); the Backend adds each one's `:latest` form."""
    from macspec.models.stores import find
    from macspec.models.stores.ollama import PREFIX, parse_name
    from macspec.serve.model_names import served_id

    target = resolved.target_name
    model_id = resolved.pair.name if resolved.pair is not None else served_id(target)
    names = {target, display_name(target), str(resolved.target)}
    stored = find(target) if resolved.pair is None else None
    if stored is not None and stored.store == "ollama":
        parsed = parse_name(target.removeprefix(PREFIX))
        short = parsed.short if parsed is not None else target.removeprefix(PREFIX)
        names |= {short, PREFIX + short}
    return model_id, tuple(sorted(names - {model_id}))
