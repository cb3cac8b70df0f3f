"""A hybrid target's recurrent state at every boundary (issue 44, item 3): a prompt sharing a
prefix with an earlier one, cut mid-way between two checkpoints, is restored after a restart to
within one block and answers as the target alone; the states between checkpoints are evicted
first, so the folder keeps its bound and older prompts thin out to their checkpoints."""

from __future__ import annotations

import os

from losslesskit import reference
from prefixkit import BLOCK, answer, engine, ids, pair

from macspec.prefix.store import DiskStore

EVERY = 4
"""A checkpoint every 4 boundaries (64 ids): the shared prefix ends between two (at 100)."""


def two_prompts():
    shared = ids(1, 100)  # boundaries 16 ... 96; checkpoints at 64 and 128
    return shared + ids(2, 80, start=100), shared + ids(3, 30, start=50)


def states(root, kind: str) -> list:
    return sorted(root.rglob(f"*.{kind}.safetensors"))


def test_a_shared_prefix_is_restored_to_within_a_block_after_a_restart(tok, tmp_path):
    target, draft = pair("qwen3_5")
    first, second = two_prompts()
    done = answer(engine(tok, target, draft, tmp_path, "qwen3_5", state_every=EVERY), first)
    assert done.tokens == reference(target, first, 8)
    assert states(tmp_path, "state-thin")  # the boundaries between checkpoints
    # A restart: a new engine on the same folder.
    warm = answer(engine(tok, target, draft, tmp_path, "qwen3_5", state_every=EVERY), second)
    assert warm.stats.disk_tokens == 96  # 100 shared ids: within one block (16)
    assert warm.tokens == reference(target, second, 8)


def test_without_dense_states_the_last_checkpoint_is_all_it_finds(tok, tmp_path):
    target, draft = pair("qwen3_5")
    first, second = two_prompts()
    sparse = dict(state_every=EVERY, dense_states=False)
    answer(engine(tok, target, draft, tmp_path, "qwen3_5", **sparse), first)
    assert not states(tmp_path, "state-thin")
    warm = answer(engine(tok, target, draft, tmp_path, "qwen3_5", **sparse), second)
    assert warm.stats.disk_tokens == 64  # the checkpoint before the shared prefix's end
    assert warm.tokens == reference(target, second, 8)


def test_thin_states_go_first_and_the_folder_keeps_its_bound(tok, tmp_path):
    target, draft = pair("qwen3_5")
    first, second = two_prompts()
    answer(engine(tok, target, draft, tmp_path, "qwen3_5", state_every=EVERY), first)
    store = DiskStore(tmp_path, 0)
    total, thin = store.total_bytes(), sum(p.stat().st_size for p in states(tmp_path, "state-thin"))
    # A bound the thin states overflow: they go (oldest first) until they fit their share.
    store.max_bytes = total - thin // 2
    store.thin_share = 0.0
    rows_before = len(list(tmp_path.rglob("*.rows.safetensors")))
    store.evict()
    assert store.total_bytes() <= store.max_bytes
    assert len(list(tmp_path.rglob("*.rows.safetensors"))) == rows_before  # rows untouched
    assert states(tmp_path, "state")  # checkpoints untouched
    left = states(tmp_path, "state-thin")
    assert 0 < len(left) < (len(first) - 1) // BLOCK  # the least recently used went
    # What is left still answers as the target alone, from a checkpoint or a thin state.
    warm = answer(engine(tok, target, draft, tmp_path, "qwen3_5", state_every=EVERY), second)
    assert warm.tokens == reference(target, second, 8)
    assert warm.stats.disk_tokens in (64, 80, 96)


def test_eviction_order_thin_states_over_their_share_then_least_recently_used(tmp_path):
    folder = tmp_path / "model" / "ab"
    folder.mkdir(parents=True)
    made = {}
    for age, name in enumerate(["a.rows", "b.state-thin", "c.state", "d.state-thin", "e.rows"]):
        path = folder / f"{name}.safetensors"
        path.write_bytes(b"x" * 100)
        stamp = 10**18 - (10 - age) * 10**9  # a older than b, ... e the newest
        os.utime(path, ns=(stamp, stamp))
        made[name] = path
    # 500 bytes over a bound of 300, no share for thin states: both go, nothing else.
    store = DiskStore(tmp_path, 300, thin_share=0.0)
    assert store.evict() == 200
    assert sorted(p.name.split(".safetensors")[0] for p in folder.iterdir()) == [
        "a.rows", "c.state", "e.rows",
    ]  # fmt: skip
    # Over their share (200 of 500 against 100 of 400): the older thin file goes, then the
    # least recently used of all (a), which brings the folder within its bound.
    for name in ("b.state-thin", "d.state-thin"):
        made[name].write_bytes(b"x" * 100)  # now the newest files
    store = DiskStore(tmp_path, 300, thin_share=1 / 3)
    assert store.evict() == 200
    assert not made["b.state-thin"].exists() and not made["a.rows"].exists()
    assert made["d.state-thin"].exists() and made["c.state"].exists()
