"""`macspec bench` as a command: drafting sources, JSON, tables, user errors, plots, scripts."""

from __future__ import annotations

import builtins
import json
import re
from dataclasses import replace
from pathlib import Path

import mlx.core as mx
import pytest
import tiny
from tiny import model_args, noisy_copy, random_model, save_model

import macspec.bench.runner
import macspec.cli.bench
from macspec.bench.figures import (
    MACSPEC,
    BenchConfig,
)
from macspec.bench.plan import BenchSettings, plan_configs
from macspec.cli import main

PLAIN0 = BenchConfig(MACSPEC, None, 0.0)


@pytest.fixture(scope="module")
def pair():
    target = random_model(0, model_args(), scale=3.0)
    return target, noisy_copy(target, 0.02, 1)


# -- the command ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def folders(pair, tmp_path_factory):
    root = tmp_path_factory.mktemp("bench")
    target, draft = pair
    prompts = root / "prompts.txt"
    prompts.write_text("Hello there\nWrite a poem about snow\n")
    return save_model(target, root / "target"), save_model(draft, root / "draft"), prompts


def bench_args(folders, *extra: str, prompt_file: bool = True) -> list[str]:
    target, draft, prompts = folders
    own_prompts = ["--prompts", str(prompts)] if prompt_file else []
    return [
        "bench",
        "--model",
        str(target),
        "--draft-model",
        str(draft),
        "--quick",
        "--max-tokens",
        "6",
        "-k",
        "2",
        *own_prompts,
        *extra,
    ]


@pytest.mark.parametrize("source", ["lookup", "hybrid"])
def test_macspec_can_draft_by_lookup_or_hybrid_and_stays_lossless(folders, capsys, source):
    assert main(bench_args(folders, "--json", "--draft", source)) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["settings"]["draft_source"] == source
    assert out["lossless"] and all(row["lossless"] for row in out["lossless"])


def test_the_grounded_prompt_set_quotes_its_input(folders, capsys):
    args = bench_args(folders, "--prompt-set", "grounded", "--json", prompt_file=False)
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    names = [p["name"] for p in out["prompts"]]
    assert names and all(not n.startswith(("chat", "writing")) for n in names)
    bad = bench_args(folders, "--prompt-set", "nonsense", prompt_file=False)
    assert main(bad) == 2
    assert "--prompt-set must be one of builtin, grounded" in capsys.readouterr().err


def test_an_unknown_draft_source_is_a_user_error(folders, capsys):
    assert main(bench_args(folders, "--draft", "crystal-ball")) == 2
    assert "--draft must list drafters out of model, lookup" in capsys.readouterr().err


def test_json_has_every_configuration_and_figure(folders, capsys):
    assert main(bench_args(folders, "--json", "--repeats", "2")) == 0
    out = json.loads(capsys.readouterr().out)
    labels = {c.label for c in plan_configs(BenchSettings(ks=(2,), auto_warm=False))}
    assert {c["config"]["label"] for c in out["configs"]} == labels
    figures = {
        "decode_tokens_per_s",
        "speedup",
        "speedup_of_medians",
        "acceptance_rate",
        "judged_acceptance",
        "tokens_per_pass",
        "wasted",
        "ttft_s",
        "peak_memory_bytes",
        "passes",
        "proposed",
        "accepted",
        "rejections",
        "draft_length",
        "runs",
    }
    for entry in out["configs"]:
        assert figures <= set(entry)
        assert entry["runs"] == 4 and entry["peak_memory_bytes"] > 0
        assert entry["decode_tokens_per_s"]["median"] > 0
        if entry["config"]["k"] == 2 and entry["config"]["temperature"] == 0:
            assert entry["proposed"] > 0 and entry["acceptance_rate"] is not None
    assert len(out["runs"]) == 4 * len(labels)
    assert {r["config"] for r in out["runs"]} == labels
    # Pooled figures agree with the per-run counts they come from.
    for entry in out["configs"]:
        runs = [r for r in out["runs"] if r["config"] == entry["config"]["label"]]
        assert entry["proposed"] == sum(r["proposed"] for r in runs)
        assert entry["wasted"] == sum(r["wasted"] for r in runs)
        assert entry["tokens_per_pass"] == pytest.approx(
            sum(r["generated_tokens"] for r in runs) / sum(r["passes"] for r in runs)
        )
    # T=0: 6 pairings; T=0.7: the coupled k=2 and auto runs against plain, same seed.
    assert len(out["lossless"]) == 8 and all(g["lossless"] for g in out["lossless"])
    assert len(out["checks"]) == 4 * 8  # 2 prompts x 2 repeats x 8 pairings
    curve = out["cost_curve"]
    assert len(curve["relative"]) == 8 and curve["relative"][0] == 1.0 and curve["draft_cost"] > 0
    # a lookup is timed too, and costs far less than a draft model's forward pass
    assert 0 < curve["lookup_cost"] < curve["draft_cost"]
    assert {t["config"] for t in out["theory"]} == {
        "macspec k=2 T=0",
        "mlx-lm k=2 T=0",
        "macspec k=2 T=0.7",
        "rejection k=2 T=0.7",
        "mlx-lm k=2 T=0.7",
    }
    assert len(out["best_k"]) == 2
    assert out["settings"]["ks"] == [2] and out["settings"]["repeats"] == 2
    assert [p["name"] for p in out["prompts"]] == ["prompt-1", "prompt-2"]
    assert "mlx_lm_proposals" in out["how_counted"]


def test_a_target_whose_output_differs_is_not_lossless(folders, capsys, monkeypatch):
    original = macspec.bench.runner.Runner._macspec

    def perturbed(self, config, prompt_ids, max_tokens, seed, waits):
        run = original(self, config, prompt_ids, max_tokens, seed, waits)
        if config.draft == "2" and config.temperature == 0:
            tokens = list(run.tokens)
            tokens[4] = (tokens[4] + 1) % 256
            run = replace(run, tokens=tuple(tokens))
        return run

    monkeypatch.setattr(macspec.bench.runner.Runner, "_macspec", perturbed)
    assert main(bench_args(folders, "--json")) == 0
    out = json.loads(capsys.readouterr().out)
    groups = {(g["config"], g["reference"]): g for g in out["lossless"]}
    assert not groups[("macspec k=2 T=0", "macspec plain T=0")]["lossless"]
    assert groups[("macspec auto T=0", "macspec plain T=0")]["lossless"]
    bad = [c for c in out["checks"] if not c["identical"]]
    assert len(bad) == 4 and {c["position"] for c in bad} == {4}
    assert all(c["margin"] is not None and c["got"] != c["expected"] for c in bad)


def test_quick_prints_a_short_summary_within_80_columns(folders, capsys):
    assert main(bench_args(folders)) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("macspec bench --quick:")
    # A verdict that must explain a passed-over median (timing noise decides) takes more lines.
    assert 5 <= len(lines) <= 18 and all(len(line) <= 80 for line in lines)
    text = "\n".join(lines)
    assert "T=0: " in text and "T=0.7: " in text and "speedup over plain: " in text
    # Each speedup with its spread over the prompts: a busy machine swings a short run.
    speedups = text[text.index("speedup over plain: ") :].split("\nlossless")[0]
    speedups = speedups.replace("\n  ", " ")
    assert re.search(r"macspec k=2 \d\.\d\dx \(\d\.\d\d-\d\.\d\d\)", speedups), speedups
    assert speedups.endswith(": median (quartiles) over the prompts")
    assert "lossless: " in text and "every table: --verbose" in text
    assert "theory against measurement" not in text


def test_table_output(folders, capsys):
    assert main(bench_args(folders, "--verbose")) == 0
    out = capsys.readouterr().out
    assert all(len(line) <= 80 for line in out.splitlines())
    for text in (
        "decoding at T=0",
        "decoding at T=0.7",
        "mlx-lm k=2",
        "macspec auto",
        "lossless: identical ids",
        "rejection k=2",
        "verify cost",
        "theory against measurement",
    ):
        assert text in out


@pytest.mark.parametrize(
    "extra, message",
    [
        (["-k", "0"], "-k must list draft lengths"),
        (["-k", "two"], "-k must be a comma-separated list"),
        (["--temp", "0"], "--temp is the sampling temperature"),
        (["--plot", "out.svg"], "--plot writes a PNG"),
    ],
)
def test_user_errors_are_one_line(folders, capsys, extra, message):
    assert main(bench_args(folders, *extra)) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_a_target_alone_is_benchmarked_with_lookup(folders, capsys):
    args = bench_args(folders, "--json")
    at = args.index("--draft-model")
    del args[at : at + 2]
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    names = {r["config"]["name"] for r in report["configs"]}
    assert "macspec k=2" in names and "mlx-lm plain" in names
    assert not any(n.startswith("mlx-lm k=") for n in names)  # mlx-lm needs a draft model
    assert main([*args, "--draft", "model"]) == 2
    assert "--draft model needs a draft model" in capsys.readouterr().err


def test_drafters_side_by_side(tmp_path, capsys):
    """An MTP head and prompt lookup in one benchmark: a row each, all lossless."""
    target = tiny.near_bigram(tiny.arch_model("qwen3_5", 0, scale=3.0), mix=0.02)
    folders = (
        tiny.save_arch_model(target, tmp_path / "target"),
        tiny.save_mtp_folder(target, tmp_path / "mtp", noise=0.005),
        tmp_path / "prompts.txt",
    )
    folders[2].write_text("Hello there\nWrite a poem about snow\n")
    assert main(bench_args(folders, "--json", "--draft", "mtp,lookup")) == 0
    report = json.loads(capsys.readouterr().out)
    names = {r["config"]["name"] for r in report["configs"]}
    assert {"macspec k=2", "macspec lookup k=2", "macspec lookup auto"} <= names
    assert report["lossless"] and all(group["lossless"] for group in report["lossless"])
    rows = {r["config"]["name"]: r for r in report["configs"] if r["config"]["temperature"] == 0}
    assert rows["macspec k=2"]["acceptance_rate"] > 0.2  # the MTP head's own row


def test_plot_without_matplotlib_fails_before_running(folders, capsys, monkeypatch, tmp_path):
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    monkeypatch.setattr(macspec.bench.runner, "run_bench", lambda *a, **k: pytest.fail("ran"))
    assert main(bench_args(folders, "--plot", str(tmp_path / "b.png"))) == 2
    assert "--plot needs matplotlib" in capsys.readouterr().err


def test_plot_is_written(folders, capsys, tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "bench.png"
    assert main(bench_args(folders, "--plot", str(path))) == 0
    assert path.stat().st_size > 1000


def test_peak_memory_is_reset_per_run(pair, tmp_path):
    target, draft = pair
    from macspec.models.loader import load_models

    folder_t, folder_d = save_model(target, tmp_path / "t"), save_model(draft, tmp_path / "d")
    loaded = load_models(folder_t, folder_d)
    runner = macspec.bench.runner.Runner(loaded, BenchSettings(max_tokens=4))
    big = mx.zeros((4096, 4096))
    mx.eval(big)  # a 64 MB peak before the run must not be charged to it
    del big
    held = mx.get_active_memory()  # the models, and whatever earlier tests left alive
    run = runner.run(PLAIN0, [1, 2, 3], 0, 0)
    assert held < run.peak_memory_bytes < held + 32e6


def test_auto_warm_keeps_its_policy_across_runs(pair, tmp_path, monkeypatch):
    from macspec.models.loader import load_models

    target, draft = pair
    loaded = load_models(save_model(target, tmp_path / "t"), save_model(draft, tmp_path / "d"))
    runner = macspec.bench.runner.Runner(loaded, BenchSettings(max_tokens=6))
    policies = []
    original = macspec.bench.runner.Engine

    def spy(*args):
        policies.append(args[3])
        return original(*args)

    monkeypatch.setattr(macspec.bench.runner, "Engine", spy)
    for config in (BenchConfig(MACSPEC, "auto-warm", 0.0), BenchConfig(MACSPEC, "auto", 0.0)):
        runner.run(config, [1, 2, 3], 0, 0)
        runner.run(config, [4, 5, 6], 1, 0)
    assert policies[0] is policies[1] and policies[2] is not policies[3]
    assert BenchConfig(MACSPEC, "auto-warm", 0.0).name == "macspec auto-warm"


def test_overhead_script_prints_the_goals(folders, capsys):
    import importlib.util

    path = Path(__file__).parents[1] / "scripts" / "figures" / "bench_overhead.py"
    spec = importlib.util.spec_from_file_location("bench_overhead", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    target, draft, prompts = folders
    argv = [
        "--model",
        str(target),
        "--draft-model",
        str(draft),
        "--k",
        "2",
        "--max-tokens",
        "6",
        "--repeats",
        "1",
        "--prompts",
        str(prompts),
    ]
    assert script.main(argv) == 0
    out = capsys.readouterr().out
    for text in ("macspec k=2 / mlx-lm k=2 tok/s", "macspec auto / macspec plain", "ms/pass"):
        assert text in out


def test_a_recurrent_pair_is_benchmarked_with_its_restores_counted(tmp_path, capsys):
    """A Mamba2 target and draft (recurrent state only): macspec speculates, mlx-lm cannot (its
    rows are left out), and the ids fed again after checkpoint restores are reported."""
    target = tiny.arch_model("mamba2", 0, scale=3.0)
    draft = tiny.noisy_arch_copy(target, 0.05, seed=1)
    folders = (
        tiny.save_arch_model(target, tmp_path / "target"),
        tiny.save_arch_model(draft, tmp_path / "draft"),
        tmp_path / "prompts.txt",
    )
    folders[2].write_text("Hello there\nWrite a poem about snow\n")
    assert main(bench_args(folders, "--json")) == 0
    report = json.loads(capsys.readouterr().out)
    rows = {(r["config"]["tool"], r["config"]["draft"]): r for r in report["configs"]}
    assert ("mlx-lm", None) in rows and not any(t == "mlx-lm" and d for t, d in rows)
    spec = rows[("macspec", "2")]
    assert spec["tokens_per_pass"] > 1 and spec["acceptance_rate"] is not None
    assert spec["refed"] > 0 and 0 < spec["refed_share"] < 1
    assert report["lossless"] and all(group["lossless"] for group in report["lossless"])
    assert main(bench_args(folders, "--verbose")) == 0
    table = capsys.readouterr().out
    assert "re-" in table and "fed" in table and "mlx-lm refuses to speculate" in table
