"""The prompt cache on disk, on every cache type: a prefix restored at a block boundary is what
a cold prefill computes there, array for array; a new engine (a new process) prefills only what
is not cached, its draft model too, and answers exactly as the target alone; conversations
sharing a system prompt share its blocks; memory and disk combine; drafters that read the
target's hidden states draft exactly as after a cold prefill."""

from __future__ import annotations

import mlx.core as mx
import pytest
import tiny
from losslesskit import done_of, reference
from prefixkit import BLOCK, KINDS, answer, engine, ids, pair, rows_files, settings

from macspec import prefix
from macspec.engine.caches import blocks
from macspec.engine.caches.blocks import Boundaries
from macspec.engine.caches.cached import CachedModel, CacheOptions, SavedCache
from macspec.engine.drafters.dflash import DFlashDrafter
from macspec.engine.drafters.mtp import MTPDrafter
from macspec.engine.generate.loop import Engine, GenerationConfig
from macspec.engine.policy.length import FixedPolicy
from macspec.models.drafters import load_dflash, load_mtp
from macspec.prefix.settings import Identity
from macspec.prefix.store import DiskStore
from macspec.serve.prompt_cache import PromptCache

# -- exact by construction -----------------------------------------------------------------------
CUTS = {
    **{kind: (kind, CacheOptions()) for kind in KINDS},
    "lfm2 short convolutions": ("lfm2", CacheOptions()),
    "llama, 8-bit KV": ("llama32", CacheOptions(kv_bits=8, kv_group_size=32)),
    "llama, 4-bit KV from id 40": ("llama32", CacheOptions(4, 32, quantized_kv_start=40)),
    "llama, --max-kv-size 20": ("llama", CacheOptions(max_kv_size=20)),
}


def cut_model(kind: str):
    if kind == "llama32":  # head_dim 32: KV quantization needs a multiple of its group size
        return tiny.random_model(0, tiny.model_args(hidden=128), scale=3.0)
    return tiny.random_model(0, scale=3.0) if kind == "llama" else tiny.arch_model(kind, 0, 3.0)


@pytest.mark.parametrize("case", list(CUTS))
def test_a_restored_boundary_computes_what_a_cold_prefill_does_bit_for_bit(case):
    kind, options = CUTS[case]
    model = cut_model(kind)
    prompt = ids(0, 75)
    stored_rows, stored_state = {}, {}

    def reached(cached: CachedModel, length: int) -> None:
        stored_rows[length // BLOCK - 1] = blocks.rows(cached.cache, length - BLOCK, length)
        stored_state[length] = blocks.state(cached.cache)
        mx.eval(stored_rows, stored_state)

    cold = CachedModel(model, options=options)
    cold.boundaries = Boundaries(BLOCK, reached)
    cold.prefill(prompt[:-1])
    want = cold.forward([*prompt[-1:], 5, 6, 7])
    assert sorted(stored_state) == [16, 32, 48, 64]
    for length in stored_state:
        quantize = None
        if options.kv_bits and length >= options.quantized_kv_start:
            quantize = (options.kv_group_size, options.kv_bits)
        cache = blocks.rebuild(
            options.make(model), length, BLOCK, stored_rows.__getitem__, stored_state[length],
            quantize,
        )  # fmt: skip
        warm = CachedModel(model, options=options)
        warm.boundaries = Boundaries(BLOCK, lambda cached, length: None)
        warm.load(SavedCache(tuple(prompt[:length]), cache, {}))
        warm.prefill(prompt[length:-1])
        got = warm.forward([*prompt[-1:], 5, 6, 7])
        assert mx.array_equal(got, want).item(), f"{case}: restored at {length}"


# -- a new process -------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_a_new_engine_prefills_only_what_is_not_cached_and_answers_as_the_target(
    tok, tmp_path, kind
):
    target, draft = pair(kind)
    prompt = ids(0, 75)  # boundaries at 16, 32, 48, 64: prefill reaches 64 (74 ids)
    want = reference(target, prompt, 8)
    cold = answer(engine(tok, target, draft, tmp_path, kind), prompt)
    assert cold.tokens == want
    assert cold.stats.disk_tokens == 0 and cold.stats.disk_written_bytes > 0
    # A restart: new engines, empty caches in memory.
    warm_engine = engine(tok, target, draft, tmp_path, kind)
    tally = prefix.tier_of(warm_engine).prepare(prompt)
    assert tally.loaded_tokens == 64
    assert len(warm_engine.target) == len(warm_engine.drafter.state) == 64  # the draft's too
    warm = done_of(warm_engine.generate(prompt, GenerationConfig(max_tokens=8)))
    assert warm.tokens == want
    assert warm.stats.prefilled_tokens == 75 - 64
    # The same caches as a cold run, draft included: the same guesses, kept and rejected.
    assert (warm.stats.draft_proposed, warm.stats.draft_accepted) == (
        cold.stats.draft_proposed,
        cold.stats.draft_accepted,
    )
    again = answer(engine(tok, target, draft, tmp_path, kind), prompt)
    assert again.tokens == want and again.stats.disk_written_bytes == 0  # nothing written twice


@pytest.mark.parametrize("kind", ["llama", "qwen3_5", "qwen3_5, sparse states"])
def test_conversations_sharing_a_system_prompt_share_its_blocks(tok, tmp_path, kind):
    kind, sparse = kind.split(",")[0], "sparse" in kind
    target, draft = pair(kind)
    system = ids(1, 40)  # two whole blocks and 8 ids
    prompts = [system + ids(seed, 30, start=100) for seed in (2, 3, 4)]
    how = dict(state_every=4, dense_states=not sparse)
    dones = [answer(engine(tok, target, draft, tmp_path, kind, **how), p) for p in prompts]
    for prompt, done in zip(prompts, dones):
        assert done.tokens == reference(target, prompt, 8)
    loaded = [d.stats.disk_tokens for d in dones]
    if not sparse:
        # The system prompt's two whole blocks (a hybrid's state at every boundary).
        assert loaded == [0, 32, 32]
    else:
        # Recurrent state at every 4th boundary and at each prompt's last only: the second
        # conversation finds no state inside the system prompt, and stores one where it leaves
        # the first one's chain: the third resumes there.
        assert loaded == [0, 0, 32]
    target_folder = DiskStore(tmp_path, 0).model_folder(f"{kind}-target".ljust(64, "0"))
    shared = [p for p in rows_files(tmp_path) if p.is_relative_to(target_folder)]
    assert len(shared) == 2 + 3 * 2  # the system prompt's blocks once, each conversation's own


@pytest.mark.parametrize("kind", ["llama", "qwen3_5"])
def test_memory_holds_the_start_and_the_disk_only_adds_the_rest(tok, tmp_path, kind, monkeypatch):
    target, draft = pair(kind)
    system = ids(1, 40)
    first, second = system + ids(2, 30, start=100), system + ids(3, 30, start=100)
    answer(engine(tok, target, draft, tmp_path, kind), second)  # an earlier process cached it
    server = engine(tok, target, draft, tmp_path, kind)
    ram = PromptCache(server, size=2)
    ram.prepare(first)
    answer(server, first)  # the live caches now hold the first conversation
    read = []
    original = DiskStore.load_many
    monkeypatch.setattr(
        DiskStore, "load_many", lambda self, wanted: read.extend(wanted) or original(self, wanted)
    )
    ram.prepare(second)
    done = answer(server, second)
    assert done.tokens == reference(target, second, 8)
    assert done.stats.prefilled_tokens == 70 - 64
    keys = prefix.tier_of(server).chains["target model"].chain.keys(second, 4)
    rows_read = [key for path, key, kind_ in read if kind_ == "rows" and "target" in str(path)]
    # Memory holds the system prompt's two blocks (a hybrid's recurrent layers cannot return
    # to them there: it reads every block); the disk gives the rest.
    head = 2 if kind == "llama" else 0
    assert sorted(rows_read) == sorted(keys[head:4])
    assert done.stats.disk_tokens == 64 - (40 if kind == "llama" else 0)


def test_a_conversation_that_goes_on_writes_its_recurrent_state_once(tok, tmp_path):
    target, draft = pair("qwen3_5")
    made = engine(tok, target, draft, tmp_path, "qwen3_5", state_every=8)
    states = lambda: sorted(tmp_path.rglob("*.state.safetensors"))  # noqa: E731
    turn = ids(0, 40)
    done = answer(made, turn, ending=False)
    assert not states()  # held in memory: the conversation may go on
    turn = [*turn, *done.tokens, *ids(5, 30, start=100)]
    answer(made, turn, ending=False)
    assert not states()  # the first turn's state was dropped, the second's is held
    answer(made, ids(9, 40), ending=False)  # another conversation: both are held
    assert not states()
    prefix.tier_of(made).drain()  # the process ends: each conversation's last state, written
    assert len(states()) == 4  # two conversations, the target's and the draft's
    again = engine(tok, target, draft, tmp_path, "qwen3_5", state_every=8)
    assert prefix.tier_of(again).prepare(turn).loaded_tokens == (len(turn) - 1) // 16 * 16


# -- drafters that read the target's hidden states ----------------------------------------------
@pytest.mark.parametrize("kind", ["mtp", "dflash"])
def test_drafters_reading_hidden_states_draft_as_after_a_cold_prefill(tok, tmp_path, kind):
    target = tiny.near_bigram(tiny.arch_model("qwen3_5", 0, scale=3.0), mix=0.02)
    config = tiny.CONFIGS[id(target)]
    if kind == "mtp":
        head = load_mtp(tiny.save_mtp_folder(target, tmp_path / "head", 0.005), config)
        make = lambda: MTPDrafter(head, target)  # noqa: E731
    else:
        head = load_dflash(tiny.save_dflash_folder(tmp_path / "head"), config)
        make = lambda: DFlashDrafter(head, target)  # noqa: E731
    prompt = ids(0, 75)
    identity = {"target model": Identity("hybrid".ljust(64, "0"), "tiny hybrid")}
    dones = []
    for _ in range(2):  # cold, then a new process
        made = Engine(target, tok, make(), FixedPolicy(2))
        prefix.attach(made, identity, settings(tmp_path / "cache"))
        dones.append(answer(made, prompt, max_tokens=16))
    cold, warm = dones
    assert warm.tokens == cold.tokens == reference(target, prompt, 16)
    assert warm.stats.disk_tokens == 64 and cold.stats.draft_proposed > 0
    assert (warm.stats.draft_proposed, warm.stats.draft_accepted) == (
        cold.stats.draft_proposed,
        cold.stats.draft_accepted,
    )
    hidden = list((tmp_path / "cache").rglob("*.hidden-*.safetensors"))
    assert len(hidden) == 4 * (1 if kind == "mtp" else 2)  # 4 blocks x each tapped output
