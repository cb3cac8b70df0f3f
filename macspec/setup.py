"""From resolved model folders to a ready Engine: the one place the pieces are wired."""

from __future__ import annotations

from macspec.catalog import ResolvedModels
from macspec.drafters import ModelDrafter
from macspec.engine import Engine
from macspec.errors import MacspecError
from macspec.loader import LoadedModels, load_models
from macspec.policy import make_policy

DRAFT_SOURCES = ("model", "lookup", "hybrid")


def build_engine(
    resolved: ResolvedModels,
    num_draft_tokens: str | None = None,
    no_draft: bool = False,
    draft: str = "model",
) -> tuple[Engine, LoadedModels]:
    """Load the models and build the engine.

    `num_draft_tokens` None means the pair's default; `draft` says where guesses come from:
    the draft model, prompt lookup (n-grams of the context, no second model), or both.
    """
    if draft not in DRAFT_SOURCES:
        raise MacspecError(f"--draft must be one of {', '.join(DRAFT_SOURCES)}, got {draft!r}")
    if draft != "model":
        raise MacspecError(f"--draft {draft} is not available yet")
    spec = num_draft_tokens
    if spec is None:
        spec = resolved.pair.draft_policy if resolved.pair is not None else "auto"
    policy = make_policy(spec)  # validated even with --no-draft: a typo is still an error
    draft_path = None if no_draft else resolved.draft
    loaded = load_models(resolved.target, draft_path)
    if loaded.draft is None:
        return Engine(loaded.target, loaded.tokenizer), loaded
    drafter = ModelDrafter(loaded.draft, vocab_size=loaded.vocab_size)
    engine = Engine(loaded.target, loaded.tokenizer, drafter, policy, vocab_size=loaded.vocab_size)
    return engine, loaded
