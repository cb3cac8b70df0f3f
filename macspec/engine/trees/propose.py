"""Growing a tree with each drafter that gives candidates.

- A draft model: one step per level over that level's inner nodes (as EAGLE-2 and SpecInfer
  grow theirs), each a tree pass of its own over the draft's cache (the nodes see the committed
  ids and their own ancestors), a node's children its top candidates in the draft's order. The
  shape is fixed before drafting, from measured acceptance by rank (`treepolicy`).
- An MTP or EAGLE-3 head: the same, each inner node fed with its parent's head output as its
  hidden state; an EAGLE-3 head's draft vocabulary mapped onto the target's (q is zero on the
  ids it cannot say).
- A DFlash block: one pass gives every position's marginal; the fixed shape filled from them,
  or (greedy and coupled runs) DDTree's best-first tree over them.
A lookup (or hybrid) drafter has one continuation to offer, so it drafts chains.

After the verdict a draft model's cache goes back to the committed ids (`release`); its next
step feeds the kept ids again, with the id the target added, in one pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx

from macspec.engine.caches import tree_attention as treeattn
from macspec.engine.core.sampling import Randomness, SamplingParams
from macspec.engine.drafters.dflash import DFlashDrafter
from macspec.engine.drafters.eagle3 import Eagle3Drafter
from macspec.engine.drafters.model import ModelDrafter
from macspec.engine.drafters.mtp import MTPDrafter
from macspec.engine.trees.shapes import Scorer, Shape, TreeDraft, ddtree, grow


@dataclass(frozen=True)
class TreePlan:
    """What to grow next cycle: a fixed shape, or (DFlash, greedy or coupled) DDTree's best
    `budget` nodes down to `depth`."""

    shape: Shape | None
    budget: int
    depth: int


def tree_drafter(drafter):
    """The drafter that would draft the next cycle (`--draft auto` picks one per cycle)."""
    return drafter.active()


def no_tree_reason(drafter) -> str | None:
    """None when this drafter can grow trees; else why not, in words."""
    drafter = tree_drafter(drafter)
    if isinstance(drafter, DFlashDrafter):
        return None
    if isinstance(drafter, ModelDrafter):
        why = treeattn.tree_ready(drafter.state.model, drafter.state.cache)
        return why and f"the draft model {why}"
    if isinstance(drafter, (MTPDrafter, Eagle3Drafter)):
        why = treeattn.tree_ready(drafter.head, drafter.cache)
        head = "MTP" if isinstance(drafter, MTPDrafter) else "EAGLE-3"
        return why and f"the {head} head {why}"
    if drafter.name == "lookup":
        return "prompt lookup finds one continuation"
    return f"the {drafter.name} drafter grows no trees"


def max_depth(drafter) -> int | None:
    """The deepest tree the drafter can grow (a DFlash block's guesses), None: no bound."""
    drafter = tree_drafter(drafter)
    return drafter.max_guesses if isinstance(drafter, DFlashDrafter) else None


def release(drafter, base: int) -> None:
    """After the verdict: a draft model's cache holds the committed ids only again (its tree
    nodes were fed in no path's order)."""
    drafter = tree_drafter(drafter)
    if isinstance(drafter, ModelDrafter):
        drafter.state.trim_to(base)


def draft_tree(
    drafter, context: Sequence[int], plan: TreePlan, params: SamplingParams,
    rng: Randomness | None,
) -> TreeDraft | None:  # fmt: skip
    """A tree after `context`, on the device; None when the drafter has nothing to draft from."""
    drafter = tree_drafter(drafter)
    scorer = Scorer(params, rng, len(context))
    if isinstance(drafter, DFlashDrafter):
        tree = _block_tree(drafter, context, plan, scorer)
    elif isinstance(drafter, (MTPDrafter, Eagle3Drafter)):
        tree = _head_tree(drafter, context, plan.shape, scorer)
    else:
        tree = _model_tree(drafter, context, plan.shape, scorer)
    if tree is not None:
        tree.source, tree.base = drafter.name, len(context)
    return tree


class _Levels:
    """Where a stepwise drafter's tree nodes sit in its cache: each inner node takes one slot
    after the committed ids, level by level; a node sees its ancestors' slots and its own."""

    def __init__(self, shape: Shape, root_position: int):
        self.shape = shape
        self.root = root_position
        """The cache position of the root (the last committed id)."""
        self.slots: dict[int, int] = {}

    def place(self, depth: int, nodes: list[int], offset: int) -> tuple[mx.array, mx.array]:
        """(positions after `offset`, visible) for a step over these inner nodes."""
        earlier = len(self.slots)
        for j, node in enumerate(nodes):
            self.slots[node] = earlier + j
        visible = [[False] * len(self.slots) for _ in nodes]
        for j, node in enumerate(nodes):
            at = node
            while at >= 0:
                visible[j][self.slots[at]] = True
                at = self.shape.parents[at]
        position = self.root + depth - offset
        return mx.full((len(nodes),), position, mx.int32), mx.array(visible)


def _model_tree(drafter: ModelDrafter, context, shape: Shape, scorer: Scorer) -> TreeDraft:
    state = drafter.state
    state.checkpoint()
    feed = context[len(state) :]
    root_logits = state.forward(feed)[-1:, : drafter.vocab_size]
    levels = _Levels(shape, len(context) - 1)
    fed = len(feed)

    def expand(depth: int, nodes: list[int], ids: mx.array) -> mx.array:
        nonlocal fed
        positions, visible = levels.place(depth, nodes, len(state))
        with treeattn.tree_pass(state.cache, positions, visible):
            logits = state.forward(ids.astype(mx.uint32))
        fed += len(nodes)
        return logits[:, : drafter.vocab_size]

    tree = grow(shape, root_logits, scorer, expand)
    tree.steps, tree.fed = shape.depth, fed
    return tree


def _head_tree(
    drafter: MTPDrafter | Eagle3Drafter, context, shape: Shape, scorer: Scorer
) -> TreeDraft | None:
    caught = drafter.catch_up(context)
    if caught is None:
        return None
    out, fed = caught
    outputs = [out]  # the head's output at each row: root, then inner nodes in order
    # Pair i of the head's cache predicts id i + 2: the root (id n - 1) is at pair n - 2.
    levels = _Levels(shape, len(context) - 2)

    def expand(depth: int, nodes: list[int], ids: mx.array) -> mx.array:
        nonlocal fed
        table = mx.concatenate(outputs, axis=0)
        parents = mx.array([shape.rows[shape.parents[i] + 1] for i in nodes], mx.int32)
        hidden = drafter._feedback(table[parents])
        positions, visible = levels.place(depth, nodes, drafter.position)
        with treeattn.tree_pass(drafter.cache, positions, visible):
            step = drafter.head(drafter.embed(ids.astype(mx.uint32)), hidden, drafter.cache)
        outputs.append(step)
        fed += len(nodes)
        return drafter.step_logits(step)

    root_logits = drafter.step_logits(out)
    tree = grow(shape, root_logits, scorer, expand)
    tree.steps, tree.fed = shape.depth, fed
    return tree


def _block_tree(drafter: DFlashDrafter, context, plan: TreePlan, scorer: Scorer):
    block = drafter.block_logits(context, plan.depth)
    if block is None:
        return None
    logits, fed = block
    if plan.shape is None:  # DDTree over the block's marginals
        if scorer.params.greedy:
            keys = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        else:  # coupled: log q + the target's noise, as the chance each id is its pick
            keys = mx.concatenate(
                [scorer(logits[d : d + 1], d)[0] for d in range(logits.shape[0])], axis=0
            )
            keys = keys - mx.logsumexp(keys, axis=-1, keepdims=True)
        tree = ddtree(keys, plan.budget)
    else:
        shape = plan.shape
        if shape.depth > logits.shape[0]:
            return None

        def expand(depth: int, nodes: list[int], ids: mx.array) -> mx.array:
            return mx.broadcast_to(logits[depth : depth + 1], (len(nodes), logits.shape[-1]))

        tree = grow(shape, logits[:1], scorer, expand)
    tree.steps, tree.fed = 1, fed
    return tree
