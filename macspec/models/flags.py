"""The drafting flags (-k, --draft, --no-draft) checked without loading anything heavy: the
CLI validates them before MLX or a model loads, so a bad flag is one line at once."""

from __future__ import annotations

from macspec.engine.policy.length import make_policy, tree_size
from macspec.errors import MacspecError
from macspec.models.catalog import MAX_DRAFT_TOKENS

DRAFT_SOURCES = ("model", "lookup", "suffix", "hybrid", "mtp", "dflash", "eagle3", "auto")
HEAD_KINDS = ("mtp", "dflash", "eagle3")
"""Drafters that read the target's hidden states; loaded from their own folders."""


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


def check_draft_flags(
    num_draft_tokens: str | None, no_draft: bool, draft: str | None, draft_tree: str | None = None
) -> None:
    """Every check of -k, --no-draft, --draft and --draft-tree that needs no model: run before
    any loading, so a bad flag is one line at once, not after a model has loaded."""
    check_draft_source(draft)
    if no_draft and draft is not None:
        raise MacspecError(f"--no-draft and --draft {draft} contradict each other; pass one")
    if tree_size(draft_tree) is not None and no_draft:
        raise MacspecError(f"--no-draft and --draft-tree {draft_tree} contradict each other")
    if num_draft_tokens is not None:
        check_draft_tokens(num_draft_tokens)
        make_policy(num_draft_tokens)  # 0, -1 and typos are one line here


def needs_draft_model(draft: str | None, no_draft: bool) -> bool:
    """Whether `--draft` / `--no-draft` need a draft folder resolved and loaded at all."""
    return not no_draft and draft != "lookup"
