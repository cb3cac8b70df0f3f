"""Sampling with draft trees keeps the target's distribution exactly (SpecInfer's recursive
rejection sampling, candidates drawn without replacement); the same harness with a wrong
rule fails the same bound."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import tiny
from samplingkit import exact_joint
from test_sampling import IdTokenizer, distribution_matches

from macspec.engine.core.events import Cycle
from macspec.engine.core.sampling import SamplingParams
from macspec.engine.drafters.model import ModelDrafter
from macspec.engine.generate.loop import Engine, GenerationConfig
from macspec.engine.policy.length import FixedPolicy
from macspec.engine.trees import verdict as treeverdict
from macspec.engine.trees.sizing import make_tree_policy

V, LENGTH, RUNS = 5, 3, 600
PARAMS = SamplingParams(temperature=1.0)
PROMPT = [1, 4, 2]


def models():
    args = tiny.model_args(vocab=V, hidden=32, layers=1, heads=2, kv_heads=1, intermediate=64)
    return tiny.random_model(11, args, scale=4.0), tiny.random_model(12, args, scale=4.0)


def sampled(target, draft) -> tuple[list[int], int]:
    """(outcome per run, runs where a candidate other than the first was kept)."""
    # Trees of 5 nodes, 2 deep: the root's first candidates, each tried after the last failed.
    policy = make_tree_policy("5", FixedPolicy(2))
    engine = Engine(target, IdTokenizer(), ModelDrafter(draft), policy)
    outcomes, later = [], 0
    for seed in range(RUNS):
        config = GenerationConfig(LENGTH, PARAMS, seed=seed, sampler="rejection")
        events = list(engine.generate(PROMPT, config))
        trees = [e.tree for e in events if isinstance(e, Cycle) and e.tree is not None]
        assert trees and all(t.nodes == 5 for t in trees if t.depth == 2)
        later += any(any(r > 0 for r in t.path_ranks) for t in trees)
        outcomes.append(int(np.ravel_multi_index(tuple(events[-1].tokens), (V,) * LENGTH)))
    return outcomes, later


def test_tree_sampling_has_the_targets_joint_distribution(monkeypatch):
    target, draft = models()
    exact = exact_joint(target, PROMPT, PARAMS, V, LENGTH)
    outcomes, later = sampled(target, draft)
    assert later > RUNS // 10  # the recursive rule kept later candidates, often
    assert distribution_matches(outcomes, exact)

    def no_residual(r, q, drawn):  # try the next candidate against p again: biased
        rest = mx.where(drawn, 0.0, q)
        return r, rest / rest.sum(axis=-1, keepdims=True)

    monkeypatch.setattr(treeverdict, "after_rejection", no_residual)
    wrong, _ = sampled(target, draft)
    assert not distribution_matches(wrong, exact)


def test_tree_sampling_with_a_smaller_draft_vocabulary_has_the_targets_distribution():
    """An EAGLE-3 head that can say 3 of the 5 ids (q is 0 at ids 1 and 3, where the target
    still puts mass), in trees of 5 nodes, 2 deep: the target's distribution, exactly."""
    from eagle3kit import three_of_five_pair

    from macspec.engine.drafters.eagle3 import Eagle3Drafter

    target, head = three_of_five_pair()
    policy = make_tree_policy("5", FixedPolicy(2))
    engine = Engine(target, IdTokenizer(), Eagle3Drafter(head, target), policy)
    outcomes, trees = [], 0
    for seed in range(RUNS):
        config = GenerationConfig(LENGTH, PARAMS, seed=seed, sampler="rejection")
        events = list(engine.generate(PROMPT, config))
        trees += sum(isinstance(e, Cycle) and e.tree is not None for e in events)
        outcomes.append(int(np.ravel_multi_index(tuple(events[-1].tokens), (V,) * LENGTH)))
    assert trees > RUNS // 2
    assert {o // V**2 for o in outcomes} & {1, 3}  # ids the head cannot guess still come
    assert distribution_matches(outcomes, exact_joint(target, PROMPT, PARAMS, V, LENGTH))
