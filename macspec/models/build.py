"""From resolved model folders to a ready Engine: the one place the pieces are wired."""

from __future__ import annotations

from macspec.engine.drafters import Drafter, ModelDrafter
from macspec.engine.lookup import HybridDrafter, LookupDrafter
from macspec.engine.loop import Engine
from macspec.engine.policy import make_policy
from macspec.errors import MacspecError
from macspec.models.catalog import MAX_DRAFT_TOKENS, ResolvedModels
from macspec.models.loader import LoadedModels, load_models

DRAFT_SOURCES = ("model", "lookup", "hybrid")


def check_draft_source(draft: str | None) -> None:
    """`--draft` must name a known source (None: the default); one line otherwise."""
    if draft is not None and draft not in DRAFT_SOURCES:
        raise MacspecError(f"--draft must be one of {', '.join(DRAFT_SOURCES)}, got {draft!r}")


def check_draft_tokens(spec: str | int) -> None:
    """A fixed `--num-draft-tokens` is bounded as the catalog's draft_policy is."""
    try:
        k = int(spec)
    except (TypeError, ValueError):
        return  # 'auto', or a typo make_policy reports
    if k > MAX_DRAFT_TOKENS:
        raise MacspecError(
            f"--num-draft-tokens must be between 1 and {MAX_DRAFT_TOKENS} (or 'auto'), got {k}"
        )


def needs_draft_model(draft: str | None, no_draft: bool) -> bool:
    """Whether `--draft` / `--no-draft` need a draft model resolved and loaded at all."""
    return not no_draft and draft != "lookup"


def build_engine(
    resolved: ResolvedModels,
    num_draft_tokens: str | None = None,
    no_draft: bool = False,
    draft: str | None = None,
) -> tuple[Engine, LoadedModels]:
    """Load the models and build the engine.

    `num_draft_tokens` None means the pair's default; `draft` says where guesses come from:
    the draft model, prompt lookup (n-grams of the context, no second model), or both;
    None: the draft model when there is one, else prompt lookup.
    """
    check_draft_source(draft)
    if no_draft and draft is not None:
        raise MacspecError(f"--no-draft and --draft {draft} contradict each other; pass one")
    spec = num_draft_tokens
    if spec is None:
        spec = resolved.pair.draft_policy if resolved.pair is not None else "auto"
    check_draft_tokens(spec)
    policy = make_policy(spec)  # validated even with --no-draft: a typo is still an error
    source = draft or ("model" if resolved.draft is not None else "lookup")
    if source != "lookup" and resolved.draft is None and not no_draft:
        raise MacspecError(
            f"--draft {source} needs a draft model (--draft-model, or a pair that has one); "
            "--draft lookup works with the target alone"
        )
    # Lookup needs no second model: a pair's draft is not even loaded.
    draft_path = None if no_draft or source == "lookup" else resolved.draft
    loaded = load_models(resolved.target, draft_path, resolved.target_name, resolved.draft_name)
    if no_draft:
        return Engine(loaded.target, loaded.tokenizer), loaded
    drafter = make_drafter(source, loaded)
    engine = Engine(loaded.target, loaded.tokenizer, drafter, policy, vocab_size=loaded.vocab_size)
    return engine, loaded


def make_drafter(draft: str, loaded: LoadedModels) -> Drafter:
    """A fresh drafter of kind `draft` ('model', 'lookup', 'hybrid') over loaded models."""
    if draft == "lookup":
        return LookupDrafter()
    if loaded.draft is None:
        raise MacspecError(f"--draft {draft} needs a draft model (--draft-model, or a --pair)")
    model = ModelDrafter(loaded.draft, vocab_size=loaded.vocab_size)
    return HybridDrafter(model) if draft == "hybrid" else model
