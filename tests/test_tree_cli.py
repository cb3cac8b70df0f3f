"""`--draft-tree` on the command line: run's stats line and --json say the trees' size, bad
values and contradictions are one line, and the bench plans trees beside the chains."""

from __future__ import annotations

import json

import pytest
import tiny

from macspec.bench.figures import MACSPEC, BenchConfig
from macspec.bench.plan import BenchSettings, plan_configs
from macspec.bench.theory import theory_rows
from macspec.cli import main


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    target = tiny.random_model(0, scale=3.0)
    return {
        "target": tiny.save_model(target, root / "target"),
        "draft": tiny.save_model(tiny.noisy_copy(target, 0.05, seed=1), root / "draft"),
    }


def run(capsys, *args) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def test_run_says_the_trees_size_in_the_stats_line_and_json(capsys, folders):
    models = ["--model", folders["target"], "--draft-model", folders["draft"], "--raw"]
    flags = [*models, "-k", "3", "--max-tokens", "24"]
    code, out, err = run(capsys, "run", "hello world", *flags, "--draft-tree", "12")
    assert code == 0 and out
    assert " nodes in " in err.splitlines()[-1] and "trees of 12.0 nodes" in err
    code, out, _ = run(capsys, "run", "hello world", *flags, "--draft-tree", "12", "--json")
    stats = json.loads(out)["stats"]
    assert stats["tree_cycles"] > 0 and stats["tree_nodes_per_cycle"] == 12
    assert stats["tree_note"] is None
    # Lookup drafts one continuation: chains, and the stats say why.
    code, out, _ = run(
        capsys, "run", "hello world", *flags, "--draft", "lookup", "--draft-tree", "8", "--json"
    )
    assert json.loads(out)["stats"]["tree_note"] == (
        "tree off: prompt lookup finds one continuation; chains"
    )


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--draft-tree", "1"], "--draft-tree must be a number of nodes from 2 to 256"),
        (["--draft-tree", "many"], "'auto' or 'off', got 'many'"),
        (["--draft-tree", "8", "--no-draft"], "--no-draft and --draft-tree 8 contradict"),
    ],
)
@pytest.mark.parametrize("command", ["run", "chat", "serve"])
def test_bad_draft_tree_values_are_one_line(capsys, folders, flags, needle, command):
    args = ["hi"] if command == "run" else []
    code, out, err = run(capsys, command, *args, "--model", folders["target"], *flags)
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], err


def test_the_bench_runs_trees_beside_the_chains():
    settings = BenchSettings(ks=(2, 3), trees=("16", "auto"), auto_warm=False)
    names = [c.label for c in plan_configs(settings)]
    for temp in ("0", "0.7"):
        at = [n for n in names if n.endswith(f"T={temp}")]
        assert at.index(f"macspec k=3 T={temp}") < at.index(f"macspec k=2 tree 16 T={temp}")
        assert f"macspec k=3 tree 16 T={temp}" in at and f"macspec auto tree T={temp}" in at
    # The chain's theory is not applied to a tree.
    tree = BenchConfig(MACSPEC, "3", 0.0, tree="16")
    assert theory_rows([_Summary(tree)], curve=None) == []


class _Summary:
    def __init__(self, config):
        self.config = config


def test_serve_says_the_trees_size_in_its_figures_and_log_line(folders, caplog):
    import logging

    from servekit import client

    from macspec.models.catalog import resolve_models
    from macspec.models.pairs import open_pair
    from macspec.serve.backend import Backend, Defaults
    from macspec.serve.server import ServerThread

    resolved = resolve_models(None, str(folders["target"]), str(folders["draft"]))
    opened = open_pair(resolved, "3", draft_tree="12")
    backend = Backend(
        opened.engine, opened.tokenizer, "tiny", context_length=400,
        defaults=Defaults(max_tokens=24), k=3,
    )  # fmt: skip
    with caplog.at_level(logging.INFO, logger="macspec.serve"), ServerThread(backend) as server:
        reply = client(server, api_key="x").completions.create(model="tiny", prompt="hello world")
    figures = reply.model_extra["macspec"]
    assert figures["tree_cycles"] > 0 and figures["tree_nodes_per_cycle"] == 12
    assert figures["tree_note"] is None
    assert any("trees of 12.0 nodes in " in r.getMessage() for r in caplog.records)
