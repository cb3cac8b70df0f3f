"""`macspec serve`: the OpenAI-compatible local server."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from macspec.cli import options as opt
from macspec.cli.app import app, fail
from macspec.cli.serve_backend import backend_for, open_batched, served_names
from macspec.cli.store_params import say_draft_choice, serve_defaults
from macspec.models.catalog import resolve_models
from macspec.models.hub import display_name


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
    gguf_layout: opt.GgufLayout = None,
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
        from macspec.cli.ranks import launched
        from macspec.cli.serve_pool import serve_pool

        if launched():
            fail("macspec serve across machines (mlx.launch) serves one --model (or --pair)")
        if draft_model is not None or any_model:
            fail("--draft-model and --any-model go with a --model; without one, every model "
                 "on this Mac is served, each with the draft --draft-model auto finds")  # fmt: skip
        listen = (host, port, api_key, max_queue, prompt_cache, False, max_batch or 8, context)
        limits = (keep_alive, max_loaded_models, memory_budget)
        opt.gguf_layout(gguf_layout, None)  # every GGUF the pool loads
        draft_args = (num_draft_tokens, no_draft, draft, draft_tree)
        serve_pool(ctx, draft_args, defaults, listen, disk, limits)
        return
    resolved = resolve_models(
        pair, model, draft_model, need_draft=needs_draft_model(draft, no_draft)
    )
    opt.gguf_layout(gguf_layout, resolved)
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


__all__ = ["backend_for", "open_batched", "serve", "served_names"]
