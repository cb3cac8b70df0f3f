"""The prompt cache on disk is never wrong: a damaged, truncated or foreign block is dropped with
one log line and never used; a process killed mid-write leaves nothing that loads; two processes
share one folder at once; the size bound holds, evicting the least recently used chains from
their ends; 0 GB writes nothing."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from losslesskit import reference
from prefixkit import answer, engine, ids, pair, rows_files

from macspec import prefix
from macspec.prefix import blockfile
from macspec.prefix.blockfile import TEMP_MARK
from macspec.prefix.store import DiskStore

TESTS = Path(__file__).resolve().parent


def second_block(root: Path, tier) -> Path:
    """The rows file of block 1 of the test prompt, for the target."""
    binding = tier.chains["target model"]
    key = binding.chain.keys(ids(0, 75), 2)[1]
    return binding.path(key, "rows")


def damage(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "a flipped byte":
        data[-100] ^= 0x40  # in the tensor bytes: mx.load would load it silently
        path.write_bytes(bytes(data))
    elif how == "truncated":
        path.write_bytes(bytes(data[: len(data) // 2]))
    else:  # another cache format under the same name (an older macspec's file)
        size = int.from_bytes(data[:8], "little")
        header = json.loads(data[8 : 8 + size])
        header["__metadata__"]["format"] = "0"
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)
        path.write_bytes(len(text).to_bytes(8, "little") + text + bytes(data[8 + size :]))


@pytest.mark.parametrize("how", ["a flipped byte", "truncated", "another format"])
def test_a_bad_block_is_dropped_with_one_line_and_never_used(tok, tmp_path, caplog, how):
    target, draft = pair("llama")
    prompt = ids(0, 75)
    first = engine(tok, target, draft, tmp_path, "llama")
    answer(first, prompt)
    bad = second_block(tmp_path, prefix.tier_of(first))
    damage(bad, how)
    with caplog.at_level(logging.WARNING, logger="macspec.prefix"):
        done = answer(engine(tok, target, draft, tmp_path, "llama"), prompt)
    assert done.tokens == reference(target, prompt, 8)
    assert done.stats.disk_tokens == 16  # only the block before it was used
    lines = [r.getMessage() for r in caplog.records if r.name == "macspec.prefix"]
    assert len(lines) == 1 and str(bad) in lines[0]
    # It was deleted, and written again whole by the prefill that replaced it.
    assert blockfile.read(bad, bad.name.split(".")[0], "rows")


KILLED_WRITER = """
import os, sys, time
sys.path.insert(0, {tests!r})
import prefixkit
def stall(fd):  # the data is in the temporary file; the rename never comes
    open({marker!r}, "w").close()
    time.sleep(60)
os.fsync = stall
prefixkit.main(["run", {root!r}, "llama"])
"""


def test_a_process_killed_mid_write_leaves_nothing_that_loads(tok, tmp_path):
    marker = tmp_path / "writing"
    script = KILLED_WRITER.format(tests=str(TESTS), marker=str(marker), root=str(tmp_path))
    child = subprocess.Popen([sys.executable, "-c", script], env={**os.environ})
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert child.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    child.send_signal(signal.SIGKILL)
    child.wait()
    temps = [p for p in tmp_path.rglob("*") if TEMP_MARK in p.name and p.suffix != ".json"]
    assert temps and not rows_files(tmp_path)  # a half-done write, under no block's name
    target, draft = pair("llama")
    done = answer(engine(tok, target, draft, tmp_path, "llama"), ids(0, 75))
    assert done.stats.disk_tokens == 0 and done.tokens == reference(target, ids(0, 75), 8)
    # Left over temporary files are deleted once they are old.
    old = time.time() - 7200
    for temp in temps:
        os.utime(temp, (old, old))
    DiskStore(tmp_path, 10**9).evict()
    assert not any(t.exists() for t in temps)


def test_two_processes_share_one_folder_at_once(tok, tmp_path):
    # This process and another write the same prompt's blocks into one folder at the same time.
    command = [sys.executable, str(TESTS / "prefixkit.py"), "ready-run", str(tmp_path), "llama"]
    child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    target, draft = pair("llama")
    here = engine(tok, target, draft, tmp_path, "llama")
    assert child.stdout.readline().strip() == "ready"
    child.stdin.write("go\n")
    child.stdin.flush()
    done_here = answer(here, ids(0, 75))
    out = child.communicate(timeout=300)[0].split()
    assert child.returncode == 0
    want = reference(target, ids(0, 75), 8)
    assert list(map(int, out[:-1])) == want == done_here.tokens
    done = answer(engine(tok, target, draft, tmp_path, "llama"), ids(0, 75))
    assert done.tokens == want and done.stats.disk_tokens == 64


def test_the_size_bound_holds_evicting_the_least_recently_used_from_the_ends(tok, tmp_path):
    target, draft = pair("llama")
    prompts = [ids(seed, 70) for seed in (1, 2, 3)]
    answer(engine(tok, target, draft, tmp_path, "llama"), prompts[0])
    files = list(tmp_path.rglob("*.safetensors"))
    per_prompt = sum(f.stat().st_size for f in files)  # 4 blocks of the target, 4 of the draft
    bound = per_prompt * 1.6 / 1e9  # room for one prompt and a half
    order = []
    for prompt in prompts[1:]:
        made = engine(tok, target, draft, tmp_path, "llama", gb=bound)
        answer(made, prompt)
        order.append(prefix.tier_of(made).chains["target model"].chain.keys(prompt, 4))
        assert DiskStore(tmp_path, 0).total_bytes() <= bound * 1e9
    first = prefix.tier_of(engine(tok, target, draft, tmp_path, "llama")).chains["target model"]
    first_keys = first.chain.keys(prompts[0], 4)
    # The newest prompt is whole; the oldest went first, its deepest blocks before its first.
    assert all(first.path(k, "rows").exists() for k in order[-1])
    assert not any(first.path(k, "rows").exists() for k in first_keys)
    middle = [first.path(k, "rows").exists() for k in order[0]]
    assert middle == sorted(middle, reverse=True)  # a chain is cut from its end


def test_zero_gigabytes_writes_nothing(tok, tmp_path):
    target, draft = pair("llama")
    made = engine(tok, target, draft, tmp_path / "cache", "llama", gb=0)
    assert prefix.tier_of(made) is None
    done = answer_plain(made, ids(0, 75))
    assert done.tokens == reference(target, ids(0, 75), 8)
    assert not (tmp_path / "cache").exists()


def answer_plain(made, prompt):
    from losslesskit import done_of

    from macspec.engine.generate.loop import GenerationConfig

    return done_of(prefix.generate(made, prompt, GenerationConfig(max_tokens=8)))


def test_a_full_disk_is_one_line_and_answers_go_on(tok, tmp_path, caplog, monkeypatch):
    def full(path, arrays, metadata):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(blockfile, "write", full)
    target, draft = pair("llama")
    with caplog.at_level(logging.WARNING, logger="macspec.prefix"):
        for seed in (0, 1):
            prompt = ids(seed, 75)
            done = answer(engine(tok, target, draft, tmp_path, "llama"), prompt)
            assert done.tokens == reference(target, prompt, 8)
    lines = [r.getMessage() for r in caplog.records if r.name == "macspec.prefix"]
    assert len(lines) == 1 and "No space left on device" in lines[0]
    assert not rows_files(tmp_path)
