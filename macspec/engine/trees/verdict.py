"""The acceptance rule over a tree: the longest root-to-leaf path the target keeps, and its
token after it. Computed on the device for every node at once; read with the cycle's one wait.

- Greedy: a node is kept when it equals the target's argmax after its parent, and so are all
  its ancestors.
- Coupled (seeded sampling): the same with the target's own seeded picks, argmax(log p / T +
  noise at the node's absolute position): the output is plain seeded decoding's.
- Rejection (unseeded sampling): SpecInfer's recursive rejection sampling, with candidates drawn
  without replacement (Jeon et al. 2024): at a node, its children x_1, x_2, ... are tried in
  draw order; x_i is kept with probability min(1, r_i(x_i) / q_i(x_i)), where r_1 is the
  target's p and q_1 the drafter's q there; after a rejection r_{i+1} = norm(max(0, r_i - q_i))
  and q_{i+1} is q_i without x_i. When every child is rejected the token is drawn from the last
  residual; at a leaf, from p. Each step is an exact speculative step (whatever q_i), so the
  kept path and its token follow p exactly, provided the tree's shape was fixed before the draws.
"""

from __future__ import annotations

import mlx.core as mx

from macspec.engine.core.sampling import sample
from macspec.engine.trees.shapes import TreeDraft


def ancestors(tree: TreeDraft) -> mx.array:
    """(N, N) bool: node j is node i or one of its ancestors."""
    n = tree.size
    nodes = mx.arange(n, dtype=mx.int32)
    seen = nodes[:, None] == nodes[None, :]
    current = tree.parents
    for _ in range(tree.depth - 1):
        valid = current >= 0
        seen = seen | ((nodes[None, :] == current[:, None]) & valid[:, None])
        current = mx.where(valid, tree.parents[mx.maximum(current, 0)], -1)
    return seen


def visibility(ancestry: mx.array, pending: int) -> mx.array:
    """(P + N, P + N) bool: what each id of a verify pass sees of the pass (it sees every
    committed id besides): the ids still to feed see each other causally, nodes see them all,
    and among nodes their ancestors and themselves."""
    n = ancestry.shape[0]
    causal = mx.tril(mx.ones((pending, pending), mx.bool_))
    top = mx.concatenate([causal, mx.zeros((pending, n), mx.bool_)], axis=1)
    bottom = mx.concatenate([mx.ones((n, pending), mx.bool_), ancestry], axis=1)
    return mx.concatenate([top, bottom], axis=0)


def positions(tree: TreeDraft, pending: int) -> mx.array:
    """Each pass row's position after the cache's offset: the ids to feed in order, then each
    node at its depth after the last of them (the root)."""
    return mx.concatenate([mx.arange(pending, dtype=mx.int32), pending - 1 + tree.depths])


def _path(tree: TreeDraft, ancestry: mx.array, deepest: mx.array) -> mx.array:
    """(D,) the nodes from depth 1 down to `deepest` (entries past its depth: junk)."""
    levels = mx.arange(1, tree.depth + 1, dtype=mx.int32)[:, None]
    on_path = ancestry[deepest][None, :] & (tree.depths[None, :] == levels)
    return mx.argmax(on_path, axis=1).astype(mx.int32)


def greedy_tree_verdict(scores: mx.array, tree: TreeDraft, ancestry: mx.array) -> mx.array:
    """Keep nodes equal to the target's pick; scores: (N + 1, V) the target's argmax rule
    after the root (row 0) and after each node. Returns, as one int32 vector: [kept, token,
    rank of the token in the drafter's order where the walk stopped (-1: not scored), then
    the path's nodes, ids and ranks, D each]."""
    picks = mx.argmax(scores, axis=-1).astype(mx.int32)
    match = tree.tokens.astype(mx.int32) == picks[tree.parents + 1]
    misses = ancestry.astype(mx.float32) @ (1 - match.astype(mx.float32))
    kept_depth = mx.where(misses == 0, tree.depths, 0)
    kept = kept_depth.max()
    deepest = mx.argmax(kept_depth)
    end = mx.where(kept > 0, deepest + 1, 0)
    token = picks[end]
    # Where the walk stopped: the rank the target's token had in the drafter's order there.
    row = tree.row_of[end]
    keys = tree.keys[mx.maximum(row, 0)]
    rank = mx.where(row >= 0, (keys > keys[token]).sum(), -1).astype(mx.int32)
    path = _path(tree, ancestry, deepest)
    head = mx.stack([kept.astype(mx.int32), token, rank])
    ids = tree.tokens[path].astype(mx.int32)
    return mx.concatenate([head, path, ids, tree.ranks[path]])


def after_rejection(r: mx.array, q: mx.array, drawn: mx.array) -> tuple[mx.array, mx.array]:
    """After candidate x (`drawn`: one-hot rows) was rejected: the target's residual
    norm(max(0, r - q)) and the draft's distribution without x."""
    rest = mx.maximum(r - q, 0.0)
    mass = rest.sum(axis=-1, keepdims=True)
    # r == q leaves no residual: rejection then had probability 0 (the row is never used).
    r = mx.where(mass > 0, rest / mx.maximum(mass, 1e-30), r)
    q_rest = mx.where(drawn, 0.0, q)
    q_mass = q_rest.sum(axis=-1, keepdims=True)
    return r, mx.where(q_mass > 0, q_rest / mx.maximum(q_mass, 1e-30), q)


def rejection_tree_verdict(p: mx.array, tree: TreeDraft, key: mx.array) -> mx.array:
    """The recursive rejection rule; p: (N + 1, V) the target's probabilities after the root
    and after each node. The tree's shape must be fixed (`tree.shape`). Returns [kept, token,
    -1, then the path's nodes, ids and ranks], as `greedy_tree_verdict`."""
    shape = tree.shape
    kids = shape.children
    inner = [u for u in range(shape.size + 1) if kids[u]]
    width = shape.width
    accept_key, end_key = mx.random.split(key)
    vocab = p.shape[-1]
    follow = mx.full((shape.size + 1,), -1, mx.int32)
    residual = mx.array(p)  # a handle of its own: rows are written below
    if inner:
        rows = mx.array(inner, mx.int32)
        child = mx.array([[k[r] if r < len(k) else -1 for r in range(width)] for k in kids])[rows]
        q = tree.q[tree.row_of[rows]]
        r = p[rows]
        uniform = mx.random.uniform(shape=(len(inner), width), key=accept_key)
        chosen = mx.full((len(inner),), -1, mx.int32)
        done = mx.zeros((len(inner),), mx.bool_)
        ids = mx.arange(vocab)
        for rank in range(width):
            c = child[:, rank]
            x = tree.tokens[mx.maximum(c, 0)].astype(mx.int32)[:, None]
            px = mx.take_along_axis(r, x, axis=-1)[:, 0]
            qx = mx.take_along_axis(q, x, axis=-1)[:, 0]
            # A draw past q's support is no draw (Gumbel-top-m ranks those last).
            tried = (c >= 0) & ~done & (qx > 0)
            take = tried & (uniform[:, rank] * qx < px)
            chosen = mx.where(take, c, chosen)
            done = done | take
            rejected = (tried & ~take)[:, None]
            r_next, q_next = after_rejection(r, q, ids[None, :] == x)
            r, q = mx.where(rejected, r_next, r), mx.where(rejected, q_next, q)
        follow[rows] = chosen
        residual[rows] = r
    ends = sample(residual, end_key).astype(mx.int32)
    # Walk from the root along the kept children.
    at, kept, path = mx.array(0, mx.int32), mx.array(0, mx.int32), []
    for _ in range(tree.depth):
        nxt = follow[at]
        ok = nxt >= 0
        path.append(mx.maximum(nxt, 0))
        kept = kept + ok.astype(mx.int32)
        at = mx.where(ok, nxt + 1, at)
    path = mx.stack(path) if path else mx.zeros((0,), mx.int32)
    head = mx.stack([kept, ends[at], mx.array(-1, mx.int32)])
    ids = tree.tokens[path].astype(mx.int32)
    return mx.concatenate([head, path, ids, tree.ranks[path]])
