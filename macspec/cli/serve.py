"""`macspec serve`: the OpenAI-compatible local server."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from macspec.cli import options as opt
from macspec.cli.app import app, fail
from macspec.models.catalog import resolve_models


@app.command()
def serve(
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
            help="Require this key from clients (Authorization: Bearer KEY).",
        ),
    ] = None,
    insecure: Annotated[
        bool,
        typer.Option("--insecure", help="Allow a non-loopback --host without --api-key."),
    ] = False,
    max_queue: Annotated[
        int,
        typer.Option(
            "--max-queue", help="Requests that may wait while one generates; more get a 429."
        ),
    ] = 32,
    prompt_cache: Annotated[
        int,
        typer.Option(
            "--prompt-cache",
            help="Conversations whose caches are kept besides the latest one (0: only that).",
        ),
    ] = 4,
    temp: opt.Temp = 0.0,
    top_p: opt.TopP = 1.0,
    top_k: opt.TopK = 0,
    min_p: opt.MinP = 0.0,
    max_tokens: Annotated[
        int, typer.Option("--max-tokens", help="Tokens per answer when a request does not say.")
    ] = 512,
    num_draft_tokens: opt.NumDraftTokens = None,
    no_draft: opt.NoDraft = False,
    draft: opt.DraftSource = None,
    draft_tree: opt.DraftTree = None,
    think: opt.Think = None,
    chat_template_args: opt.ChatTemplateArgs = None,
) -> None:
    """Serve the model over an OpenAI-compatible API, with speculative decoding.

    Routes: /v1/chat/completions, /v1/completions, /v1/models, /health. One generation at a
    time; requests wait in a bounded queue.

    Sampling flags are the defaults for requests that leave them out.

    Under `mlx.launch -n N -- python -m macspec serve …` the target is sharded over the N
    ranks: rank 0 serves, the others run each generation with it.
    """
    # MLX, mlx-lm, FastAPI and uvicorn load here, not at import: `macspec --help` stays instant.
    from macspec.cli.ranks import ranks
    from macspec.engine.sampling import SamplingParams
    from macspec.models.flags import check_draft_flags, needs_draft_model
    from macspec.models.templates import template_args
    from macspec.serve.backend import Defaults
    from macspec.serve.server import check_host

    check_host(host, api_key, insecure)
    check_draft_flags(num_draft_tokens, no_draft, draft, draft_tree)  # before any model loads
    if not 0 <= port <= 65535:
        fail(f"--port must be in 0..65535, got {port}")
    if max_queue < 0 or prompt_cache < 0:
        fail("--max-queue and --prompt-cache must be >= 0")
    if max_tokens < 1:
        fail(f"--max-tokens must be >= 1, got {max_tokens}")
    SamplingParams(temperature=temp, top_p=top_p, top_k=top_k, min_p=min_p)  # checks ranges
    args = template_args(think, chat_template_args)
    defaults = Defaults(temp, top_p, top_k, min_p, max_tokens, args)
    resolved = resolve_models(
        pair, model, draft_model, need_draft=needs_draft_model(draft, no_draft)
    )
    # Under mlx.launch the target is sharded over every rank: rank 0 serves, the others follow.
    with ranks() as here:
        where = {} if here is None else {"group": here.group, "watchdog": here.watchdog}
        served = serve_models(
            resolved, (num_draft_tokens, no_draft, draft, draft_tree), where, defaults,
            (host, port, api_key, max_queue, prompt_cache),
        )  # fmt: skip
    if served is not None:
        fail(f"{served}")


def serve_models(
    resolved, draft_args: tuple, where: dict, defaults, listen: tuple
) -> BaseException | None:
    """Load, then serve until stopped (rank 0, or alone) or follow rank 0 (other ranks).
    Returns the error that stopped the server, if one did (a lost rank)."""
    import signal

    from macspec.chat.pairs import open_models
    from macspec.serve.backend import Backend
    from macspec.serve.ranks import Leader, follow
    from macspec.serve.server import run_server

    host, port, api_key, max_queue, prompt_cache = listen
    num_draft_tokens, no_draft, draft, draft_tree = draft_args
    print(f"macspec: loading {resolved.target_name}…", file=sys.stderr, flush=True)
    loaded = open_models(
        resolved, num_draft_tokens, no_draft, draft, **where, draft_tree=draft_tree
    )
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
    for warning in loaded.warnings:
        print(f"macspec: warning: {warning}", file=sys.stderr)
    model_id = resolved.pair.name if resolved.pair is not None else resolved.target_name
    aliases = tuple({resolved.target_name, str(resolved.target)} - {model_id})
    k = num_draft_tokens or (resolved.pair.draft_policy if resolved.pair is not None else "auto")
    backend = Backend(
        engine,
        loaded.tokenizer,
        model_id,
        context_length=loaded.context_length,
        defaults=defaults,
        aliases=aliases,
        k=int(k) if str(k).isdigit() else k,
        max_queue=max_queue,
        prompt_cache_size=prompt_cache,
        leader=leader,
    )
    drafter = engine.drafter.name if engine.drafter is not None else "none"
    spread = f", target sharded over {where['group'].size()} ranks" if where else ""

    def announce(url: str) -> None:
        print(
            f"macspec: serving {model_id} (drafts: {drafter}{spread}) at {url}; Ctrl-C stops",
            file=sys.stderr,
            flush=True,
        )

    run_server(backend, host, port, api_key, announce)
    fatal = backend.worker.fatal
    if leader is not None and fatal is None:
        fatal = leader.stop()
    print("macspec: server stopped", file=sys.stderr)
    return fatal
