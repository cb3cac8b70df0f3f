"""The record of one guess-and-verify cycle: what stats count and policies learn from.

Its own module so `stats` (which counts cycles) and `events` (which carries stats in `Done`)
both build on it without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TreeOutcome:
    """What a tree cycle adds to its record: the tree, and the ranks the policy learns from."""

    nodes: int
    """Nodes verified (the cycle's `proposed`)."""
    depth: int
    """The deepest node's depth."""
    path_ranks: tuple[int, ...]
    """Rank among its siblings (0 first) of each kept node, from depth 1 down."""
    stop_rank: int | None
    """Where the walk stopped: the rank of the target's token in the drafter's order there
    (greedy and coupled runs), None when not known."""
    stop_children: int
    """Candidates the node where the walk stopped had (all rejected)."""
    grown: str = "shape"
    """How the tree was grown: 'shape' (fixed from measured acceptance) or 'ddtree'."""


@dataclass(frozen=True)
class Cycle:
    """One guess-and-verify cycle (a plain decoding step is a cycle with nothing proposed)."""

    requested: int
    """Draft length the policy asked for."""
    proposed: int
    """Tokens actually drafted (drafting stops early on low confidence or EOS)."""
    accepted: int
    """Drafted tokens the target kept."""
    draft_s: float
    """Seconds spent drafting."""
    verify_s: float
    """Seconds of the target's verify pass and the acceptance rule."""
    overhead_s: float
    """Other seconds of the cycle (bookkeeping between passes)."""
    draft_steps: int
    """Forward passes the drafter ran."""
    draft_fed: int
    """Ids the drafter processed (more than draft_steps when it catches up after plain steps)."""
    draft_source: str | None = None
    """Which drafter's guesses these were ('model', 'lookup'); None when nothing was proposed."""
    fed: int = 0
    """Ids the target's pass processed: the ids still to feed, then the guesses."""
    timed: bool = True
    """Whether draft_s and verify_s time drafting and verifying apart (a probe cycle, or a
    plain step); other cycles wait once, so only their whole time (verify_s) is known."""
    refed: int = 0
    """Of those, ids fed again after a checkpoint was restored (recurrent or wrapped
    sliding-window caches roll back that way); 0 for attention-only models."""
    rows: int = 1
    """Requests whose ids shared this cycle's target pass (batched decoding), this one too."""
    tree: TreeOutcome | None = None
    """A tree cycle's tree (`proposed` counts its nodes); None for a chain or a plain step."""
