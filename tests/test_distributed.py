"""A target sharded over two ranks (`mlx.launch -n 2 --backend ring` on localhost, mlx[cpu]):
the same answers as one process, the same decisions on every rank, one line when a rank dies.

One launch plays every scenario of tests/distkit.py; the tests read what each rank wrote.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from distkit import MAX_TOKENS, PROMPT, play
from losslesskit import reference
from tiny import noisy_copy, random_model, save_model

from macspec.cli import main

LAUNCH_TIMEOUT_S = 240
"""Far above the ~30 s a launch takes on 2 busy cores: a hang fails the test, not CI."""


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, Path]:
    """A tiny float32 target and a close draft (most guesses kept, some rejected)."""
    root = tmp_path_factory.mktemp("pair")
    target = random_model(0, scale=3.0)
    save_model(target, root / "target")
    save_model(noisy_copy(target, 0.05, 1), root / "draft")
    return root / "target", root / "draft"


@pytest.fixture(scope="module")
def ranks(pair, tmp_path_factory) -> list[dict[str, dict]]:
    """Each rank's records by scenario name, from one launch of tests/distkit.py."""
    launcher = shutil.which("mlx.launch", path=str(Path(sys.executable).parent))
    assert launcher is not None, "mlx.launch is installed with mlx"
    out = tmp_path_factory.mktemp("ranks")
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": f"{repo}{os.pathsep}{repo / 'tests'}"}
    # The launcher execs its command: the interpreter is named, not the script.
    command = [launcher, "-n", "2", "--backend", "ring", "--", sys.executable]
    command += [str(repo / "tests" / "distkit.py"), str(out), *map(str, pair)]
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S
    )
    records = []
    for rank in (0, 1):
        path = out / f"rank{rank}.jsonl"
        assert path.is_file(), f"rank {rank} wrote nothing:\n{done.stdout}\n{done.stderr}"
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        records.append({r["name"]: r for r in lines})
    return records


@pytest.fixture(scope="module")
def target_alone(pair):
    """The whole target in one process, loaded by mlx-lm."""
    from mlx_lm import load

    return load(str(pair[0]))[0]


@pytest.fixture(scope="module")
def alone(target_alone) -> list[int]:
    """mlx-lm's own greedy decoding of the whole target in one process."""
    return reference(target_alone, PROMPT, MAX_TOKENS)


@pytest.mark.parametrize("name", ["plain", "k4", "auto", "lookup", "skewed"])
def test_greedy_is_the_target_alone(ranks, alone, name):
    assert len(alone) > 10
    for rank in ranks:
        assert rank[name]["tokens"] == alone


def test_speculation_counts_match_one_process(ranks, pair):
    """Tokens per pass, acceptance and every cycle as single-process speculation."""
    single = play("k4", *pair)
    assert single["accepted"] > 0, "the draft should get some guesses right"
    assert single["accepted"] < single["proposed"], "and some wrong"
    for rank in ranks:
        got = rank["k4"]
        for key in ("tokens", "cycles", "passes", "accepted", "proposed"):
            assert got[key] == single[key], key
    assert ranks[0]["k4"]["passes"] < len(ranks[0]["k4"]["tokens"])


def test_one_exchange_per_cycle(ranks):
    """The agreement costs one all_gather per cycle plus two at the start (prompt, settings)."""
    for rank in ranks:
        assert rank["k4"]["exchanges"] == len(rank["k4"]["cycles"]) + 2
        assert rank["plain"]["exchanges"] == 2  # no draft, no policy: nothing to agree on


def test_seeded_sampling_as_one_process(ranks, pair):
    """Coupled sampling with a seed: the target's own seeded sample, on every rank, with or
    without speculation; the rejection rule with a seed: the same on every rank as alone."""
    plain = play("coupled-plain", *pair)["tokens"]
    rejection = play("rejection", *pair)["tokens"]
    for rank in ranks:
        assert rank["coupled"]["tokens"] == plain
        assert rank["coupled-plain"]["tokens"] == plain
        assert rank["rejection"]["tokens"] == rejection
    assert ranks[0]["unseeded"]["tokens"] == ranks[1]["unseeded"]["tokens"]


def test_rank0_decides_every_k(ranks):
    """`auto` makes the same choices on every rank; a rank whose own policy wants another k
    (rank 1 of `skewed` wants 1, rank 0 wants 4) is overruled every cycle."""
    assert ranks[0]["auto"]["cycles"] == ranks[1]["auto"]["cycles"]
    skewed = [rank["skewed"] for rank in ranks]
    assert skewed[0]["cycles"] == skewed[1]["cycles"]
    assert {c[0] for c in skewed[0]["cycles"]} == {4}
    assert skewed[0]["overruled"] == 0
    assert skewed[1]["overruled"] == len(skewed[1]["cycles"])


def test_only_rank0_writes(ranks, target_alone):
    first, other = ranks[0]["cli"], ranks[1]["cli"]
    assert first["code"] == other["code"] == 0
    record = json.loads(first["stdout"])
    assert record["tokens"] == reference(target_alone, record["prompt_tokens"], MAX_TOKENS)
    assert record["ranks"] == 2
    assert other["stdout"] == other["stderr"] == ""


def test_a_killed_rank_ends_the_other_in_one_line(ranks):
    killed, survivor = ranks[1]["killed"], ranks[0]["survivor"]
    assert survivor["code"] == 2
    errors = [line for line in survivor["stderr"].splitlines() if "error" in line]
    assert len(errors) == 1
    # Whichever comes first: the ring noticing the lost peer, or mlx.launch's SIGTERM.
    assert errors[0].startswith(
        ("macspec: error: rank 0 lost the other ranks", "macspec: error: stopped by SIGTERM")
    )
    assert survivor["at"] - killed["at"] < 10


def launched_run(monkeypatch, capsys, pair, **env: str) -> tuple[int, list[str]]:
    """`macspec run` in this process as if a launcher had set `env`: exit code, stderr lines."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    target, draft = pair
    code = main(["run", "--model", str(target), "--draft-model", str(draft), "--raw", "hi"])
    return code, capsys.readouterr().err.splitlines()


def test_missing_hostfile_is_one_line(monkeypatch, capsys, pair, tmp_path):
    missing = tmp_path / "hosts.json"
    code, err = launched_run(monkeypatch, capsys, pair, MLX_RANK="0", MLX_HOSTFILE=str(missing))
    assert code == 2
    assert err == [f"macspec: error: the hostfile {missing} (MLX_HOSTFILE) does not exist"]


def test_malformed_hostfile_is_one_line(monkeypatch, capsys, pair, tmp_path):
    hosts = tmp_path / "hosts.json"
    hosts.write_text("h1 h2\n")
    code, err = launched_run(monkeypatch, capsys, pair, MLX_RANK="0", MLX_HOSTFILE=str(hosts))
    assert code == 2
    assert len(err) == 1
    assert err[0].startswith("macspec: error: cannot join the other ranks (mlx.distributed): ")


def test_commands_for_one_machine_refuse_a_launcher(monkeypatch, capsys):
    monkeypatch.setenv("MLX_RANK", "1")
    assert main(["chat"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "macspec: error: macspec chat runs on one machine; across machines (mlx.launch) use "
        "macspec run, bench, serve"
    ]


def test_bench_on_two_ranks_prints_once_from_rank0(pair, tmp_path):
    """`macspec bench` under mlx.launch: both ranks bench the sharded target, rank 0 alone
    prints the cost of a pass per m, tokens per pass, the speedups and a lossless line."""
    launcher = shutil.which("mlx.launch", path=str(Path(sys.executable).parent))
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Hello there\n")
    repo = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    command = [launcher, "-n", "2", "--backend", "ring", "--", sys.executable, "-m", "macspec"]
    command += ["bench", "--model", str(pair[0]), "--draft-model", str(pair[1]), "--quick",
                "--max-tokens", "8", "-k", "2", "--prompts", str(prompts)]  # fmt: skip
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert sum(line.startswith("macspec bench --quick:") for line in lines) == 1
    assert sum(line.startswith("target sharded over 2 ranks") for line in lines) == 1
    [curve] = [line for line in lines if line.startswith("pass over m ids, ms (m=1..8): ")]
    assert len(curve.split(": ")[1].split()) == 8
    [per_pass] = [line for line in lines if line.startswith("tokens per pass at T=0: ")]
    assert "macspec k=2 " in per_pass
    assert sum(line.startswith("speedup over plain: macspec k=2 ") for line in lines) == 2
    [lossless] = [line for line in lines if "answers identical" in line]
    assert lossless.startswith("lossless: ")
    assert "mlx-lm plain" not in done.stdout
