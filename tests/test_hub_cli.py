"""`macspec pull`, `macspec models`, `macspec rm` against a private HF cache, with no network."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
from hubkit import PAIR, cli, files_bytes, tree, write_tiny_pair

from macspec.models import home, hub


@pytest.fixture
def tiny_pair(hf_cache) -> Path:
    return write_tiny_pair()


# ---- pull -----------------------------------------------------------------------------------


def test_pull_of_a_cached_pair_works_offline(
    capsys, cached_model, tiny_pair, monkeypatch, network_calls
):
    target, draft = cached_model("test/tiny-target"), cached_model("test/tiny-draft")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, out, err = cli(capsys, "pull", "tiny")
    assert (code, err) == (0, "")
    assert f"test/tiny-target: already downloaded ({target})" in out
    assert f"test/tiny-draft: already downloaded ({draft})" in out
    assert network_calls == []


def test_second_pull_does_no_network_work_even_online(
    capsys, cached_model, network_calls, monkeypatch
):
    cached_model("test/tiny-target")
    monkeypatch.setattr(hub, "plan_download", lambda repo: pytest.fail("asked the hub"))
    code, out, _ = cli(capsys, "pull", "test/tiny-target")
    assert code == 0 and "already downloaded" in out
    assert network_calls == []


def test_pull_downloads_what_is_missing_with_progress(
    capsys, cached_model, tiny_pair, tiny_model_folder, hf_cache, monkeypatch
):
    """The flow around huggingface_hub: plan, disk check, download with a tqdm_class, report."""
    cached_model("test/tiny-draft")  # shared draft already here: only the target is fetched
    plans, downloads, reports = [], [], []

    def fake_plan(repo):
        plans.append(repo)
        return hub.DownloadPlan(repo, 1000, 3)

    def fake_snapshot_download(repo, *, tqdm_class=None, allow_patterns=None, **kwargs):
        if kwargs.get("local_files_only"):
            return real_snapshot_download(repo, allow_patterns=allow_patterns, **kwargs)
        downloads.append((repo, allow_patterns, kwargs["cache_dir"]))
        # what huggingface_hub 2.x does with the class: byte bars it grows and updates
        transfer = tqdm_class(desc="Downloading bytes", total=0, initial=0, unit="B")
        rebuild = tqdm_class(desc="Reconstructing (incomplete total...)", total=0, unit="B")
        rebuild.total = 600
        rebuild.refresh()
        for bar in (transfer, rebuild):
            bar.update(600)
        return str(cached_model(repo))

    real_snapshot_download = hub.snapshot_download
    monkeypatch.setattr(hub, "plan_download", fake_plan)
    monkeypatch.setattr(hub, "download_config", lambda repo: None)
    monkeypatch.setattr(hub, "snapshot_download", fake_snapshot_download)
    original = hub._progress_class

    def spy(repo, callback):
        return original(repo, lambda event: (reports.append(event), callback(event)))

    monkeypatch.setattr(hub, "_progress_class", spy)
    code, out, err = cli(capsys, "pull", "tiny")
    assert code == 0, err
    assert plans == ["test/tiny-target"]
    assert downloads == [("test/tiny-target", hub.ALLOW_PATTERNS, hf_cache)]
    assert reports[-1] == hub.DownloadProgress("test/tiny-target", 600, 600)
    assert "test/tiny-target: downloaded" in out and "tiny-draft: already downloaded" in out
    assert "test/tiny-target" in err  # the progress display


@pytest.mark.parametrize(
    ("args", "stdin", "code", "downloaded"),
    [(("--yes",), "", 0, True), ((), "y\n", 0, True), ((), "n\n", 1, False), ((), None, 2, False)],
)
def test_pull_of_a_pair_that_will_not_fit_asks_before_any_network_work(
    capsys, tiny_pair, monkeypatch, cached_model, args, stdin, code, downloaded
):
    asked_the_hub = []

    def plan(repo):
        asked_the_hub.append(repo)
        return hub.DownloadPlan(repo, 10, 1)

    monkeypatch.setattr(hub, "plan_download", plan)
    monkeypatch.setattr(hub, "download_config", lambda repo: pytest.fail("network before asking"))
    monkeypatch.setattr(hub, "download", lambda repo, on_progress=None: cached_model(repo))
    monkeypatch.setattr("macspec.models.memory.machine_memory_bytes", lambda: 1000)
    if stdin is None:
        monkeypatch.setattr("sys.stdin", io.StringIO(""))  # closed: no answer
    else:
        monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    result, _, err = cli(capsys, "pull", "tiny", *args)
    assert result == code, err
    assert "warning: tiny needs about" in err and "may not run" in err
    assert bool(asked_the_hub) == downloaded
    if not downloaded:
        assert "nothing downloaded" in err and hub.cached_model_path("test/tiny-target") is None


def test_pull_sizes_an_unknown_pair_from_its_config_once_the_download_is_planned(
    capsys, tiny_pair, monkeypatch, cached_model
):
    """A pair the offline estimate cannot size (no known or cached config.json) is not asked
    about; once the download is planned its config.json is fetched and a pair too big for
    this machine is still named in a warning."""
    big = dict(num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, head_dim=128)
    fetched = []
    monkeypatch.setattr(hub, "plan_download", lambda repo: hub.DownloadPlan(repo, 10, 1))
    monkeypatch.setattr(hub, "download_config", lambda repo: fetched.append(repo) or big)
    monkeypatch.setattr(hub, "download", lambda repo, on_progress=None: cached_model(repo))
    monkeypatch.setattr("macspec.models.memory.machine_memory_bytes", lambda: 10**8)
    monkeypatch.setattr("sys.stdin", io.StringIO(""))  # a question would find no answer
    code, _, err = cli(capsys, "pull", "tiny")
    assert code == 0, err
    assert fetched and "warning: tiny needs about" in err and "may not run" in err


def test_pull_demo_needs_no_download(capsys, hf_cache, monkeypatch, tmp_path, tiny_model_folder):
    monkeypatch.setattr(hub, "PACKAGE_ROOT", tmp_path / "pkg")
    for member in ("target", "draft-tuned", "draft", "mtp"):  # two drafts and an MTP head
        shutil.copytree(tiny_model_folder, tmp_path / "pkg" / "demo" / member)
    code, out, _ = cli(capsys, "pull", "demo")
    assert code == 0 and "needs no download" in out


# ---- models ---------------------------------------------------------------------------------


def test_models_json_reports_paths_and_sizes(capsys, cached_model, tiny_pair):
    target, draft = cached_model("test/tiny-target"), cached_model("test/tiny-draft")
    code, out, err = cli(capsys, "models", "--json")
    assert (code, err) == (0, "")
    rows = {row["name"]: row for row in json.loads(out)}
    tiny = rows["tiny"]
    assert tiny["downloaded"] is True
    assert (tiny["target_path"], tiny["draft_path"]) == (str(target), str(draft))
    assert tiny["target_size_bytes"] == files_bytes(target)
    assert tiny["draft_size_bytes"] == files_bytes(draft)
    assert tiny["size_on_disk_bytes"] == files_bytes(target) + files_bytes(draft)
    assert tiny["memory_bytes"] == tiny["weights_bytes"] + tiny["kv_cache_bytes"]
    assert isinstance(tiny["fits"], bool)
    absent = rows["tiny2"]
    assert (absent["downloaded"], absent["target_path"]) == (False, None)
    assert absent["draft_path"] == str(draft)  # the shared draft is here
    assert rows["qwen3-8b"]["target_path"] is None and rows["qwen3-8b"]["estimated"] is True


def test_models_table(capsys, cached_model, tiny_pair):
    cached_model("test/tiny-target")
    cached_model("test/tiny-draft")
    code, out, _ = cli(capsys, "models")
    assert code == 0
    line = next(line for line in out.splitlines() if "tiny " in line)
    assert "yes" in line and "~0.0 GB" in line
    assert "qwen3-8b" in out and "This machine" in out
    # an undownloaded catalog pair is estimated from its published facts, marked '~'
    qwen = next(line for line in out.splitlines() if "qwen3-8b " in line)
    assert " ~" in qwen and ("yes~" in qwen or "no~" in qwen)


def test_models_names_the_drafters_it_does_not_serve(capsys):
    code, out, _ = cli(capsys, "models", "--json")
    rows = {row["name"]: row for row in json.loads(out)}
    assert rows["llama-3.3-70b"]["heads"] == {
        "eagle3": "RedHatAI/Llama-3.3-70B-Instruct-speculator.eagle3"
    }
    assert any("gemma-4-31B-it-DFlash" in note for note in rows["gemma4-31b"]["unsupported"])
    code, out, _ = cli(capsys, "models")
    assert code == 0 and "Published drafters macspec does not serve" in out
    line = next(line for line in out.splitlines() if "RedHatAI/gemma-4-31B-it-speculator" in line)
    assert line.strip().startswith("gemma4-31b: eagle3")


def test_models_shows_memory_per_rank_for_a_sharded_pair(capsys, cached_model, tiny_pair):
    """A pair whose target needs 2 machines: the table and --json show what each one holds."""
    tiny_pair.write_text(tiny_pair.read_text().replace('name = "tiny"', 'name = "tiny"\nranks = 2'))
    cached_model("test/tiny-target")
    draft = cached_model("test/tiny-draft")
    code, out, _ = cli(capsys, "models", "--json")
    rows = {row["name"]: row for row in json.loads(out)}
    tiny, alone = rows["tiny"], rows["qwen3-8b"]
    assert (tiny["ranks"], alone["ranks"]) == (2, 1)
    assert alone["memory_per_rank_bytes"] == alone["memory_bytes"]
    target_part = tiny["memory_bytes"] - files_weights(draft) - tiny["kv_cache_bytes"] // 2
    per_rank = -(-target_part // 2) + files_weights(draft) + tiny["kv_cache_bytes"] // 2
    assert tiny["memory_per_rank_bytes"] == per_rank < tiny["memory_bytes"]
    code, out, _ = cli(capsys, "models")
    assert code == 0
    line = next(line for line in out.splitlines() if "tiny " in line)
    assert "2×" in line
    assert "N×: on each of N machines" in " ".join(out.split())


def files_weights(folder) -> int:
    return sum(p.stat().st_size for p in folder.glob("*.safetensors"))


def test_models_estimates_pairs_that_are_not_downloaded(capsys, monkeypatch):
    monkeypatch.setattr("macspec.models.memory.machine_memory_bytes", lambda: 64 * 10**9)
    code, out, _ = cli(capsys, "models", "--json")
    rows = {row["name"]: row for row in json.loads(out)}
    qwen = rows["qwen2.5-7b"]  # 28 layers x 4 KV heads x 128 + a 24 x 2 x 64 draft, fp16
    assert qwen["downloaded"] is False and qwen["estimated"] is True
    per_token = 2 * 2 * (28 * 4 * 128 + 24 * 2 * 64)
    assert qwen["kv_cache_bytes"] == per_token * qwen["context_length"]
    assert qwen["fits"] is True
    # the hybrid and sliding-window layers hold less: only 1 layer in 4 / in 6 grows
    assert rows["qwen3.5-27b"]["kv_cache_bytes"] < rows["qwen3-32b"]["kv_cache_bytes"] / 3
    assert rows["llama-3.3-70b"]["fits"] is False  # about 52 GB: more than 64 GB Macs give
    monkeypatch.setattr("macspec.models.memory.machine_memory_bytes", lambda: 128 * 10**9)
    code, out, _ = cli(capsys, "models", "--json")
    assert {row["name"]: row for row in json.loads(out)}["llama-3.3-70b"]["fits"] is True
    monkeypatch.setattr("macspec.models.memory.machine_memory_bytes", lambda: 16 * 10**9)
    code, out, _ = cli(capsys, "models", "--json")
    assert {row["name"]: row for row in json.loads(out)}["llama-3.3-70b"]["fits"] is False
    # small sizes in MB, not '0.0 GB'
    code, out, _ = cli(capsys, "models")
    demo = next(line for line in out.splitlines() if "demo " in line)
    assert "MB" in demo and "0.0 GB" not in demo


# ---- rm -------------------------------------------------------------------------------------


def test_rm_removes_the_pair_but_keeps_a_draft_another_pair_uses(
    capsys, cached_model, tiny_pair, hf_cache
):
    for repo in ("test/tiny-target", "test/tiny-target2", "test/tiny-draft"):
        cached_model(repo)
    code, out, _ = cli(capsys, "rm", "tiny", "--yes")
    assert code == 0
    assert "removed test/tiny-target" in out and "kept test/tiny-draft (also used by tiny2)" in out
    assert not hub.repo_cache_folder("test/tiny-target").exists()
    assert hub.repo_cache_folder("test/tiny-draft").exists()
    code, out, _ = cli(capsys, "rm", "tiny2", "-y")
    assert code == 0 and "removed test/tiny-draft" in out
    assert sorted(p.name for p in hf_cache.iterdir()) == []


def test_rm_of_one_repo(capsys, cached_model):
    cached_model("test/tiny-target")
    code, out, _ = cli(capsys, "rm", "test/tiny-target", "--yes")
    assert code == 0 and "removed test/tiny-target" in out
    assert hub.cached_model_path("test/tiny-target") is None


def test_rm_without_an_answer_removes_nothing(capsys, cached_model, monkeypatch):
    snapshot = cached_model("test/tiny-target")
    code, _, err = cli(capsys, "rm", "test/tiny-target")  # pytest's stdin cannot be read
    assert code == 2
    assert err.strip().endswith(
        "no answer on stdin, nothing removed (pass --yes to remove without asking)"
    )
    assert snapshot.is_dir()


@pytest.mark.parametrize(
    ("answer", "code", "removed"), [("y\n", 0, True), ("n\n", 1, False), ("", 2, False)]
)
def test_rm_asks_first(cached_model, answer, code, removed):
    from typer.testing import CliRunner

    from macspec.cli import app

    cached_model("test/tiny-target")
    result = CliRunner().invoke(app, ["rm", "test/tiny-target"], input=answer)
    assert hub.repo_cache_folder("test/tiny-target").exists() is not removed
    assert "Remove test/tiny-target (" in result.output
    if code == 2:  # EOF: the error the entry point prints as one line
        assert "no answer on stdin" in str(result.exception)
    else:
        assert result.exit_code == code
        assert ("removed test/tiny-target" if removed else "nothing removed") in result.output


def test_rm_never_touches_the_demo(capsys, hf_cache):
    code, _, err = cli(capsys, "rm", "demo", "--yes")
    assert code == 2 and "nothing to remove" in err


# ---- bad input: one line on stderr, exit 2, nothing written ---------------------------------


def _malformed(_):
    home.user_catalog_path().write_text("[[pair]]\nname = 'x'\ntarget = \n")


def _unknown_key(_):
    home.user_catalog_path().write_text(
        PAIR.replace("size_gb = 0.01\n", "size_gb = 0.01\nk=1\n", 1)
    )


def _missing_field(_):
    home.user_catalog_path().write_text(PAIR.replace('description = "a test pair"\n', ""))


def _duplicate(_):
    home.user_catalog_path().write_text(PAIR.replace('"tiny2"', '"tiny"'))


def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _disk_full(monkeypatch):
    monkeypatch.setattr(hub, "plan_download", lambda repo: hub.DownloadPlan(repo, 5 * 10**9, 3))
    monkeypatch.setattr(hub, "free_disk_bytes", lambda path: 10**6)


def _nothing(_):
    pass


@pytest.mark.parametrize(
    ("setup", "args", "message"),
    [
        (_nothing, ["pull", "nope"], "unknown pair 'nope' (known: demo, "),
        (_nothing, ["rm", "nope"], "'nope' is no pair or Hugging Face repo: rm removes a"),
        (_nothing, ["rm", "/m/x.gguf"], "converted files go with `macspec cache clear --model"),
        (_malformed, ["models"], "models.toml: invalid TOML: line 3, column 10: invalid value"),
        (_unknown_key, ["models"], "models.toml: pair 'tiny': unknown key 'k'"),
        (_missing_field, ["pull", "tiny"], "models.toml: pair 'tiny': missing field 'description'"),
        (_duplicate, ["models", "--json"], "models.toml: duplicate pair name 'tiny'"),
        (
            _offline,
            ["pull", "tiny"],
            "test/tiny-target is not downloaded and HF_HUB_OFFLINE is set",
        ),
        (
            _nothing,
            ["pull", "test/absent"],  # online, but the hub cannot be reached
            "cannot reach the Hugging Face hub to download test/absent",
        ),
        (
            _disk_full,
            ["pull", "tiny"],
            "not enough disk space for tiny: needs 10.0 GB, 0.0 GB free",
        ),
        (_nothing, ["rm", "tiny", "--yes"], "tiny is not downloaded; nothing to remove"),
        (
            _nothing,
            ["rm", "test/absent", "--yes"],
            "test/absent is not downloaded; nothing to remove",
        ),
        (_nothing, ["pull", "a/b/c"], "unknown pair 'a/b/c'"),
    ],
)
def test_bad_input_is_one_line_exit_2_nothing_written(
    capsys, tiny_pair, hf_cache, monkeypatch, setup, args, message
):
    setup(monkeypatch)
    home_dir = home.macspec_home()
    before = tree(hf_cache), tree(home_dir)
    code, out, err = cli(capsys, *args)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("macspec: error: ")
    assert message in err
    assert (tree(hf_cache), tree(home_dir)) == before


def test_a_pair_whose_tokenizers_differ_is_refused_naming_both(
    capsys, tiny_pair, hf_cache, cached_model, tmp_path
):
    from conftest import put_in_hf_cache
    from tiny import random_model, save_model

    cached_model("test/tiny-target")
    other = save_model(random_model(1), tmp_path / "other", tokenizer_shift=7)
    put_in_hf_cache(hf_cache, "test/tiny-draft", other)
    code, out, err = cli(capsys, "run", "hi", "--pair", "tiny")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "tokenizers differ" in err
    assert "tiny-draft" in err and "tiny-target" in err
