"""From resolved model folders to a ready Engine: the one place the pieces are wired."""

from __future__ import annotations

from macspec.catalog import ResolvedModels
from macspec.drafters import Drafter, ModelDrafter
from macspec.engine import Engine
from macspec.errors import MacspecError
from macspec.loader import LoadedModels, load_models
from macspec.lookup import HybridDrafter, LookupDrafter
from macspec.policy import make_policy

DRAFT_SOURCES = ("model", "lookup", "hybrid")
LOOKUP_DRAFT_TOKENS = 8
"""`--draft lookup`'s default draft length: a fixed k, not 'auto'. A lookup guess costs no
forward pass, which AutoPolicy's cost model (k x a draft step) has no measurement for, so
with lookup alone it would settle on plain decoding. A fixed k wastes little: lookup proposes
only on a match (a miss is a plain step), and on a GPU a verify pass over a few more ids costs
about one pass. Where verify grows with m (a CPU), pass `-k` smaller if matches are poor."""


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
    spec = num_draft_tokens
    if spec is None and draft == "lookup":
        spec = str(LOOKUP_DRAFT_TOKENS)
    elif spec is None:
        spec = resolved.pair.draft_policy if resolved.pair is not None else "auto"
    policy = make_policy(spec)  # validated even with --no-draft: a typo is still an error
    if draft == "hybrid" and resolved.draft is None and not no_draft:
        raise MacspecError(
            "--draft hybrid needs a draft model (--draft-model, or a --pair); "
            "--draft lookup works with the target alone"
        )
    # Lookup needs no second model: a pair's draft is not even loaded.
    draft_path = None if no_draft or draft == "lookup" else resolved.draft
    loaded = load_models(resolved.target, draft_path)
    if no_draft or (loaded.draft is None and draft != "lookup"):
        return Engine(loaded.target, loaded.tokenizer), loaded
    if draft == "lookup" and spec.strip().lower() == "auto":
        loaded.warnings.append(
            "--num-draft-tokens auto cannot price lookup guesses (they cost no forward "
            f"pass) and mostly decodes plainly; lookup's default is {LOOKUP_DRAFT_TOKENS}"
        )
    drafter = make_drafter(draft, loaded)
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
