"""Every drafter fed token streams built to be hard: one id repeated, short periods, long
repeats, matches that run to the end of the history, empty and one-id contexts, ids at the
vocabulary's edges, histories past the suffix store's bound.

- The history-only drafters (suffix, lookup), property-tested with hypothesis: every proposal
  is well formed (at most k ids, ids seen in the history, no q) and `rollback` to any point
  works, across requests that share one store.
- Every drafter with a model (model, hybrid, auto, MTP, DFlash, EAGLE-3, and trees of each that
  grows them) on the tiny fixtures: greedy and seeded answers to hard prompts equal plain
  decoding, at k = 1, 4 and 8.
"""

from __future__ import annotations

import eagle3kit as kit
import pytest
import tiny
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from macspec.engine.core.sampling import SamplingParams
from macspec.engine.drafters.dflash import DFlashDrafter
from macspec.engine.drafters.eagle3 import Eagle3Drafter
from macspec.engine.drafters.lookup import HybridDrafter, LookupDrafter
from macspec.engine.drafters.model import ModelDrafter
from macspec.engine.drafters.mtp import MTPDrafter
from macspec.engine.drafters.suffix import SaidTokens, SuffixDrafter
from macspec.engine.generate.loop import Engine, GenerationConfig
from macspec.engine.policy.choice import DrafterChoice
from macspec.engine.policy.length import FixedPolicy
from macspec.engine.trees.sizing import make_tree_policy
from macspec.models.drafters import load_dflash, load_mtp
from macspec.models.eagle3 import load_eagle3

VOCAB = tiny.VOCAB
GREEDY = SamplingParams()


# -- streams built to be hard -------------------------------------------------------------------
def edge_ids(vocab: int):
    return st.sampled_from([0, 1, vocab - 2, vocab - 1])


def stream(vocab: int = VOCAB) -> st.SearchStrategy[list[int]]:
    any_id = st.integers(0, vocab - 1)
    chunk = st.lists(st.one_of(any_id, edge_ids(vocab)), min_size=1, max_size=6)
    return st.one_of(
        st.builds(lambda t, n: [t] * n, st.one_of(any_id, edge_ids(vocab)), st.integers(0, 90)),
        st.builds(lambda c, n: (c * n)[: 3 * 40], chunk, st.integers(1, 40)),  # short periods
        st.lists(st.sampled_from([0, vocab - 1, 7]), max_size=60),  # a tiny alphabet
        st.lists(any_id, max_size=60),
        st.builds(lambda a, c, b: a + c * 5 + b, chunk, st.lists(any_id, max_size=50), chunk),
    )


def check_proposal(draft, k: int, history: set[int]) -> None:
    tokens = list(draft.tokens)
    assert len(tokens) <= k
    assert all(t in history for t in tokens), (tokens, history)
    assert draft.q is None  # deterministic guesses: the verdict is exact


def exercise(drafter, requests: list[list[int]], ks: list[int], cuts: list[int]) -> None:
    """Each request: start it, then grow its context id by id, proposing at every step, and
    roll back now and then to any earlier point (the engine's rejected guesses)."""
    history: set[int] = set()
    for r, ids in enumerate(requests):
        prompt_len = min(len(ids), cuts[r % len(cuts)] % (len(ids) + 1))
        context = list(ids[:prompt_len])
        drafter.start(context)
        history |= set(context)
        for i in range(prompt_len, len(ids) + 1):
            k = ks[i % len(ks)]
            check_proposal(drafter.propose(context, k, GREEDY, None, None), k, history)
            if i == len(ids):
                break
            context.append(ids[i])
            history.add(ids[i])
            drafter.rollback(max(0, len(context) - 1 - cuts[i % len(cuts)] % 2))
        drafter.rollback(cuts[r % len(cuts)] % (len(context) + 1))


SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
REQUESTS = st.lists(stream(), min_size=1, max_size=4)
KS = st.lists(st.sampled_from([1, 2, 4, 8, 16]), min_size=1, max_size=4)
CUTS = st.lists(st.integers(0, 200), min_size=1, max_size=4)


@SETTINGS
@given(REQUESTS, KS, CUTS, st.sampled_from([16, 64, 100_000]), st.integers(1, 3))
def test_suffix_proposals_are_well_formed(requests, ks, cuts, bound, key):
    """A store shared by the requests, bounded so tightly that most of them are evicted."""
    said = SaidTokens(max_tokens=bound, key=key, max_depth=8, max_candidates=8)
    exercise(SuffixDrafter(said), requests, ks, cuts)
    assert len(said) <= max(bound, max(map(len, requests)) + 1)


@SETTINGS
@given(REQUESTS, KS, CUTS)
def test_lookup_proposals_are_well_formed(requests, ks, cuts):
    exercise(LookupDrafter(), requests, ks, cuts)


def test_a_match_that_runs_to_the_end_of_the_history():
    """The bug that took `serve` down: 60 times one id, the latest occurrence of the context's
    key is the context's own end."""
    for context in ([5] * 60, [1, 2] * 30, [9, 9, 9], [3]):
        drafter = SuffixDrafter()
        drafter.start(context)
        tokens = drafter.propose(context, 8, GREEDY, None, None).tokens
        assert len(tokens) <= 8 and set(tokens) <= set(context)
    assert SuffixDrafter().propose([], 4, GREEDY, None, None).tokens == []


# -- every drafter with a model, end to end -----------------------------------------------------
HARD_PROMPTS = [
    [65] * 40,
    [97, 98] * 20,
    [VOCAB - 1, 0, VOCAB - 1, 0, 3],
    [120],
    list(range(48, 58)) * 4,
]
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def llama_pair():
    target = tiny.random_model(0, scale=3.0)
    return target, tiny.noisy_copy(target, 0.05, seed=1)


@pytest.fixture(scope="module")
def hidden_pairs(tmp_path_factory):
    """(target, make_drafter) for MTP, DFlash and EAGLE-3 on the tiny fixtures."""
    mtp_target = tiny.near_bigram(tiny.arch_model("qwen3_5", 0, scale=3.0), mix=0.02)
    mtp = load_mtp(
        tiny.save_mtp_folder(mtp_target, tmp_path_factory.mktemp("mtp"), noise=0.005),
        tiny.CONFIGS[id(mtp_target)],
    )
    block_target = tiny.arch_model("qwen3", 0, scale=3.0)
    block = load_dflash(
        tiny.save_dflash_folder(tmp_path_factory.mktemp("dflash"), target_layer_ids=(0, 1)),
        tiny.CONFIGS[id(block_target)],
    )
    eagle_target = kit.llama_target()
    weights = kit.constructed(eagle_target, (0, 1, 3), noise=0.3)
    folder = kit.save_folder(
        eagle_target, tmp_path_factory.mktemp("eagle"), weights, (0, 1, 3), "eagle"
    )
    head = load_eagle3(folder, kit.target_config(eagle_target))
    return {
        "mtp": (mtp_target, lambda: MTPDrafter(mtp, mtp_target)),
        "dflash": (block_target, lambda: DFlashDrafter(block, block_target)),
        "eagle3": (eagle_target, lambda: Eagle3Drafter(head, eagle_target)),
    }


def drafters_of(name: str, llama_pair, hidden_pairs):
    target, draft = llama_pair
    simple = {
        "model": lambda: ModelDrafter(draft),
        "lookup": LookupDrafter,
        "suffix": SuffixDrafter,
        "hybrid": lambda: HybridDrafter(ModelDrafter(draft), lookup=SuffixDrafter()),
        "auto": lambda: DrafterChoice([ModelDrafter(draft), LookupDrafter(), SuffixDrafter()]),
    }
    if name in simple:
        return target, simple[name]
    return hidden_pairs[name]


TREES = {"model", "mtp", "dflash", "eagle3"}
"""The drafters that grow trees (`--draft-tree`)."""


@pytest.mark.parametrize(
    "name", ["model", "lookup", "suffix", "hybrid", "auto", "mtp", "dflash", "eagle3"]
)
def test_hard_prompts_are_the_target_alone_at_every_k(tok, llama_pair, hidden_pairs, name):
    target, make = drafters_of(name, llama_pair, hidden_pairs)
    plain = Engine(target, tok)
    configs = [GenerationConfig(max_tokens=MAX_TOKENS)] + [
        GenerationConfig(max_tokens=MAX_TOKENS, sampling=SamplingParams(0.9), seed=seed)
        for seed in (0,)
    ]
    wants = {
        (i, j): list(plain.generate(prompt, config))[-1].tokens
        for i, prompt in enumerate(HARD_PROMPTS)
        for j, config in enumerate(configs)
    }
    for k in (1, 4, 8):
        for tree in ("off", "8") if name in TREES else ("off",):
            drafter = make()
            policy = drafter if isinstance(drafter, DrafterChoice) else FixedPolicy(k)
            engine = Engine(target, tok, drafter, make_tree_policy(tree, policy))
            for (i, j), want in wants.items():
                done = list(engine.generate(HARD_PROMPTS[i], configs[j]))[-1]
                assert done.tokens == want, (name, k, tree, i, j)
                assert not done.stats.plain_reason or "switched off" not in done.stats.plain_reason
