"""From resolved model folders to a ready Engine: the one place the pieces are wired."""

from __future__ import annotations

from macspec.catalog import ResolvedModels
from macspec.drafters import ModelDrafter
from macspec.engine import Engine
from macspec.loader import LoadedModels, load_models
from macspec.policy import make_policy


def build_engine(
    resolved: ResolvedModels, num_draft_tokens: str | None = None, no_draft: bool = False
) -> tuple[Engine, LoadedModels]:
    """Load the models and build the engine; `num_draft_tokens` None means the pair's default."""
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
