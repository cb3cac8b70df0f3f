"""Draft trees (`--draft-tree`): several candidates per position, verified in one target pass.

Greedy output is mlx-lm's target-alone greedy token for token with trees from a draft model,
an MTP head, an EAGLE-3 head (its draft vocabulary smaller than the target's) and a block
drafter (DDTree and the measured shape); seeded output is plain decoding's with the seed; one
target pass per tree; after a tree cycle the caches hold exactly the kept path, also in a hybrid
target's Gated DeltaNet layers (one state per branch); other recurrent targets verify chains and
say so.
"""

from __future__ import annotations

import eagle3kit
import pytest
import tiny
from losslesskit import PROMPTS, done_of, passes_of, reference
from treekit import OracleBlock, mtp_head

from macspec.engine.core.events import Cycle
from macspec.engine.core.sampling import SamplingParams
from macspec.engine.drafters.dflash import DFlashDrafter
from macspec.engine.drafters.eagle3 import Eagle3Drafter
from macspec.engine.drafters.model import ModelDrafter
from macspec.engine.drafters.mtp import MTPDrafter
from macspec.engine.generate.loop import Engine, GenerationConfig
from macspec.engine.policy.length import FixedPolicy
from macspec.engine.trees.sizing import make_tree_policy
from macspec.models.drafters import load_dflash
from macspec.models.eagle3 import load_eagle3

MAX_TOKENS = 12


@pytest.fixture(scope="module")
def llama():
    target = tiny.random_model(0, scale=3.0)
    return target, tiny.noisy_copy(target, 0.05, seed=3)


@pytest.fixture(scope="module")
def qwen3_mtp():
    target = tiny.near_bigram(tiny.arch_model("qwen3", 0, scale=3.0), mix=0.02)
    return target, mtp_head(target)


@pytest.fixture(scope="module")
def llama_eagle3(tmp_path_factory):
    target, taps = eagle3kit.llama_target(), (0, 1, 3)
    weights = eagle3kit.constructed(target, taps, noise=0.3)
    folder = eagle3kit.save_folder(target, tmp_path_factory.mktemp("eagle3"), weights, taps)
    return target, load_eagle3(folder, eagle3kit.target_config(target))


@pytest.fixture(scope="module")
def qwen3_block(tok, tmp_path_factory):
    target = tiny.arch_model("qwen3", 0, scale=3.0)
    folder = tiny.save_dflash_folder(tmp_path_factory.mktemp("dflash"), target_layer_ids=(0, 1))
    return target, load_dflash(folder, tiny.CONFIGS[id(target)])


def prompts_of(tok) -> list[list[int]]:
    return [tok.encode(text) for text in PROMPTS]


def run_all(tok, target, drafter, size="8", k=4, force_ddtree=None):
    """Greedy over every prompt with one engine; (outputs equal mlx-lm's, stats summed)."""
    engine = Engine(target, tok, drafter, make_tree_policy(size, FixedPolicy(k)))
    if force_ddtree is not None:
        engine.policy._ddtree_next = lambda: force_ddtree
    same, passes, decided, trees, kept, refed = 0, 0, 0, 0, 0, 0
    for prompt in prompts_of(tok):
        done = done_of(engine.generate(prompt, GenerationConfig(max_tokens=MAX_TOKENS)))
        assert done.tokens == reference(target, prompt, MAX_TOKENS), tok.decode(prompt)
        same += 1
        passes += done.stats.target_passes
        decided += done.stats.generated_tokens + done.stats.end_tokens
        trees += done.stats.tree_cycles
        kept += done.stats.draft_accepted
        refed += done.stats.refed_tokens
    stats = dict(same=same, per_pass=decided / passes, trees=trees, kept=kept, refed=refed)
    return engine, stats


def test_draft_model_trees_are_the_target_alone(tok, llama):
    target, draft = llama
    engine, tree = run_all(tok, target, ModelDrafter(draft), size="10")
    assert tree["trees"] > 0 and tree["kept"] > 0
    # The draft model's cache holds committed ids only between cycles (its tree slots gone).
    assert engine.drafter.state.tokens == engine.target.tokens[: len(engine.drafter.state)]


def test_a_tree_keeps_more_per_pass_than_the_chain_at_its_depth(tok, llama):
    target, draft = llama
    per_pass = {}
    for size in ("off", "16"):
        engine = Engine(target, tok, ModelDrafter(draft), make_tree_policy(size, FixedPolicy(4)))
        decided = passes = 0
        for prompt in prompts_of(tok)[:4]:
            stats = done_of(engine.generate(prompt, GenerationConfig(max_tokens=24))).stats
            decided += stats.generated_tokens + stats.end_tokens
            passes += stats.target_passes
        per_pass[size] = decided / passes
    assert per_pass["16"] > per_pass["off"] + 0.2, per_pass


def test_mtp_head_trees_are_the_target_alone(tok, qwen3_mtp):
    target, head = qwen3_mtp
    _, stats = run_all(tok, target, MTPDrafter(head, target), size="12")
    assert stats["trees"] > 0 and stats["kept"] > 0


def test_eagle3_head_trees_are_the_target_alone(tok, llama_eagle3):
    target, head = llama_eagle3
    chain = run_all(tok, target, Eagle3Drafter(head, target), size="off")[1]
    _, tree = run_all(tok, target, Eagle3Drafter(head, target), size="12")
    assert tree["trees"] > 0 and tree["kept"] > 0
    assert tree["per_pass"] > chain["per_pass"], (chain, tree)


@pytest.mark.parametrize("ddtree", [True, False], ids=["ddtree", "measured shape"])
def test_block_drafter_trees_are_the_target_alone(tok, qwen3_block, ddtree):
    target, model = qwen3_block
    # Marginals sharp on the target's own tokens for half the prompts (paths are kept), else
    # nothing to draft from (chains of nothing: plain steps).
    answers = {tuple(p): reference(target, p, MAX_TOKENS) for p in prompts_of(tok)[::2]}
    drafter = OracleBlock(model, target, answers, sharp=3.0)
    _, stats = run_all(tok, target, drafter, size="10", force_ddtree=ddtree)
    assert stats["trees"] > 0 and stats["kept"] > 0


def test_a_dflash_drafter_grows_trees(tok, qwen3_block):
    target, model = qwen3_block
    policy = make_tree_policy("10", FixedPolicy(3))
    engine = Engine(target, tok, DFlashDrafter(model, target), policy)
    for prompt in prompts_of(tok)[:4]:
        done = done_of(engine.generate(prompt, GenerationConfig(max_tokens=MAX_TOKENS)))
        assert done.tokens == reference(target, prompt, MAX_TOKENS)
        assert done.stats.tree_cycles > 0


def test_one_target_pass_per_tree(tok, llama):
    target, draft = llama
    engine = Engine(target, tok, ModelDrafter(draft), make_tree_policy("16", FixedPolicy(4)))
    prompt = tok.encode("The quick brown fox")
    # The first generation checks the target once: a tree pass against a sequential one.
    done_of(engine.generate(tok.encode("hello"), GenerationConfig(max_tokens=4)))
    with passes_of(target) as calls:
        events = list(engine.generate(prompt, GenerationConfig(max_tokens=24)))
    cycles = [e for e in events if isinstance(e, Cycle)]
    done = done_of(events)
    assert done.tokens == reference(target, prompt, 24)
    # One prefill call, then one pass per cycle, each over the id to feed and a whole tree.
    assert len(calls) == 1 + len(cycles) == 1 + done.stats.target_passes
    assert calls[1:] == [1 + c.proposed for c in cycles]
    trees = [c for c in cycles if c.tree is not None]
    assert len(trees) >= len(cycles) - 1 and trees[0].tree.nodes == 16
    # Paths through a candidate other than the drafter's first were kept too.
    assert any(any(r > 0 for r in c.tree.path_ranks) for c in trees)


@pytest.mark.parametrize("drafter_kind", ["model", "mtp", "hybrid mtp", "eagle3"])
def test_seeded_output_with_trees_is_plain_decodings(
    tok, llama, qwen3_mtp, hybrid_mtp, llama_eagle3, drafter_kind
):
    pairs = {"model": llama, "mtp": qwen3_mtp, "hybrid mtp": hybrid_mtp, "eagle3": llama_eagle3}
    target, extra = pairs[drafter_kind]
    if drafter_kind == "model":
        drafter = ModelDrafter(extra)
    elif drafter_kind == "eagle3":
        drafter = Eagle3Drafter(extra, target)
    else:
        drafter = MTPDrafter(extra, target)
    engine = Engine(target, tok, drafter, make_tree_policy("12", FixedPolicy(3)))
    plain = Engine(target, tok)
    trees = 0
    for seed, prompt in enumerate(prompts_of(tok)[:8]):
        config = GenerationConfig(
            max_tokens=MAX_TOKENS, sampling=SamplingParams(temperature=0.9), seed=seed
        )
        done = done_of(engine.generate(prompt, config))
        assert done.stats.sampler == "coupled"
        assert done.tokens == done_of(plain.generate(prompt, config)).tokens
        trees += done.stats.tree_cycles
    assert trees > 0


def test_closing_mid_tree_cycle_leaves_the_delivered_prefix(tok, llama):
    target, draft = llama
    engine = Engine(target, tok, ModelDrafter(draft), make_tree_policy("16", FixedPolicy(4)))
    prompt = tok.encode("Once upon a time")
    want = reference(target, prompt, 16)
    events = engine.generate(prompt, GenerationConfig(max_tokens=16))
    got = []
    for event in events:
        if hasattr(event, "source"):
            got.append(event.id)
            if len(got) == 5:  # inside a cycle's kept path, most likely
                break
    events.close()
    assert got == want[:5]
    assert engine.target.tokens == prompt + want[:4]  # the last delivered one is fed next
    # The next generation reuses that prefix and is still the target's own.
    done = done_of(engine.generate(prompt, GenerationConfig(max_tokens=16)))
    assert done.tokens == want


@pytest.fixture(scope="module")
def hybrid_mtp():
    target = tiny.near_bigram(tiny.arch_model("qwen3_5", 0, scale=3.0), mix=0.02)
    return target, mtp_head(target)


def test_hybrid_targets_branch_their_recurrent_state(tok, hybrid_mtp):
    """Qwen3.5's Gated DeltaNet layers take a tree pass with one state per branch, and keep
    the kept path's state after it."""
    target, head = hybrid_mtp
    _, stats = run_all(tok, target, MTPDrafter(head, target), size="12")
    assert stats["trees"] > 0 and stats["kept"] > 0
    assert stats["refed"] == 0  # no state restored and fed again: the kept path's own


def test_other_recurrent_targets_verify_chains_and_say_why(tok):
    target = tiny.arch_model("lfm2", 0, scale=3.0)  # short convolutions: not Gated DeltaNet
    engine = Engine(
        target,
        tok,
        ModelDrafter(tiny.unrelated_llama(target)),
        make_tree_policy("8", FixedPolicy(3)),
    )
    for prompt in prompts_of(tok)[:2]:
        done = done_of(engine.generate(prompt, GenerationConfig(max_tokens=MAX_TOKENS)))
        assert done.tokens == reference(target, prompt, MAX_TOKENS)
        assert done.stats.tree_cycles == 0 and done.stats.draft_proposed > 0
        assert done.stats.tree_note.startswith("tree off: the target has recurrent layers")


def test_trees_on_a_quantized_kv_cache_match_chains(tok):
    from macspec.engine.core.config import CacheOptions

    target = tiny.random_model(0, tiny.model_args(hidden=128, heads=4, kv_heads=2), scale=3.0)
    draft = tiny.noisy_copy(target, 0.03, seed=1)  # head_dim 32: one quantization group
    options = CacheOptions(kv_bits=8, kv_group_size=32, quantized_kv_start=0)

    def engine(size):
        policy = make_tree_policy(size, FixedPolicy(3))
        drafter = ModelDrafter(draft, options=options)
        return Engine(target, tok, drafter, policy, cache_options=options)

    chains, trees = engine("off"), engine("12")
    for prompt in prompts_of(tok)[:4]:
        chain = done_of(chains.generate(prompt, GenerationConfig(max_tokens=MAX_TOKENS)))
        tree = done_of(trees.generate(prompt, GenerationConfig(max_tokens=MAX_TOKENS)))
        assert tree.tokens == chain.tokens and tree.stats.tree_cycles > 0
    assert type(trees.target.cache[0]).__name__ == "QuantizedKVCache"


@pytest.mark.parametrize("sampler", [None, "coupled", "rejection"])
def test_one_host_device_wait_per_tree_cycle(tok, llama, sampler):
    """The tree stays on the device into the verify pass; its verdict and kept path are read
    together, once (the bench's own counter, bench/waits.py)."""
    from test_waits import waits_per_cycle

    from macspec.bench.waits import WaitCounter

    target, draft = llama
    engine = Engine(target, tok, ModelDrafter(draft), make_tree_policy("8", FixedPolicy(3)))
    done_of(engine.generate(tok.encode("hi"), GenerationConfig(max_tokens=3)))  # its check
    temperature = 0.0 if sampler is None else 0.8
    config = GenerationConfig(24, SamplingParams(temperature=temperature), seed=1, sampler=sampler)
    with WaitCounter([target, draft]) as waits:
        cycles = waits_per_cycle(engine, tok.encode("the cat sat on the mat"), config, waits)
    trees = [w for c, w in cycles if c.tree is not None]
    assert len(trees) >= 3 and all(w == 1 for w in trees), cycles


def test_an_end_of_sequence_on_a_kept_path_ends_the_answer_there():
    from test_sampling import IdTokenizer

    class EndsAt3(IdTokenizer):
        eos_token_ids = frozenset({3})

    args = tiny.model_args(vocab=8, hidden=32, layers=1, heads=2, kv_heads=1, intermediate=64)
    target = tiny.random_model(11, args, scale=2.0)
    draft = tiny.noisy_copy(target, 0.1, seed=2)
    engine = Engine(target, EndsAt3(), ModelDrafter(draft), make_tree_policy("8", FixedPolicy(3)))
    ended = 0
    for start in range(12):
        prompt = [(start * 7 + i) % 8 for i in range(4)]
        done = done_of(engine.generate(prompt, GenerationConfig(max_tokens=20)))
        assert done.tokens == reference(target, prompt, 20, eos=frozenset({3}))
        ended += done.finish_reason == "stop"
    assert ended > 4  # many answers end at the end of sequence, inside trees' kept paths
