"""The Backend `macspec serve` builds over a loaded pair (its names, context window and
settings), for one --model and for each model the pool loads."""

from __future__ import annotations

import sys

from macspec.models.catalog import ResolvedModels
from macspec.models.hub import display_name

NO_CHAT_ROUTES = (
    "the model has no chat template: the chat routes (/v1/chat/completions, /v1/responses, "
    "/v1/messages, /api/chat) refuse requests; /v1/completions and /api/generate work"
)
"""Serve's start-up warning for a base model (run's and chat's is NO_TEMPLATE)."""


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
