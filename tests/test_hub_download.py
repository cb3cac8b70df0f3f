"""The hub module, and `macspec pull` through the real huggingface_hub against a fake hub."""

from __future__ import annotations

from pathlib import Path

import pytest
from hubkit import cli, write_tiny_pair

from macspec.models import hub


@pytest.fixture
def tiny_pair(hf_cache) -> Path:
    return write_tiny_pair()


# ---- hub helpers ----------------------------------------------------------------------------


def test_hub_reads_the_environment_on_every_call(monkeypatch, tmp_path):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    assert hub.hf_cache_dir() == tmp_path / "home" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "c"))
    assert hub.hf_cache_dir() == tmp_path / "c"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub.is_offline()


def test_free_disk_bytes_of_a_cache_not_made_yet(tmp_path):
    assert hub.free_disk_bytes(tmp_path / "not" / "yet") > 0


def test_a_cached_fake_model_loads_with_mlx_lm(cached_model):
    from mlx_lm.utils import load

    snapshot = cached_model("test/tiny-target")
    model, tokenizer = load(str(hub.local_model_path("test/tiny-target")))
    assert hub.local_model_path("test/tiny-target") == snapshot
    assert tokenizer.encode("hi") and model.layers


# ---- against a fake hub on localhost: the real huggingface_hub download path ----------------


def test_pull_from_the_hub_then_a_second_pull_asks_nothing(
    capsys, fake_hub, tiny_pair, tiny_model_folder, hf_cache
):
    for repo in ("test/tiny-target", "test/tiny-draft"):
        fake_hub.add(repo, tiny_model_folder)
    code, out, err = cli(capsys, "pull", "tiny")
    assert code == 0, err
    snapshot = hub.cached_model_path("test/tiny-target")
    assert snapshot is not None and f"test/tiny-target: downloaded ({snapshot})" in out
    assert sorted(p.name for p in snapshot.iterdir()) == sorted(
        p.name for p in tiny_model_folder.iterdir()
    )  # model files only: no README.md
    assert "test/tiny-draft" in err  # the progress display
    fake_hub.log.clear()
    code, out, _ = cli(capsys, "pull", "tiny")
    assert code == 0 and out.count("already downloaded") == 2
    assert fake_hub.log == []


def test_pull_after_an_interruption_fetches_only_the_missing_files(
    capsys, fake_hub, hf_cache, tiny_model_folder
):
    fake_hub.add("test/tiny-target", tiny_model_folder)
    assert cli(capsys, "pull", "test/tiny-target")[0] == 0
    snapshot = hub.cached_model_path("test/tiny-target")
    weights = snapshot / "model.safetensors"
    weights.resolve().unlink()  # as if the pull was stopped before the weights came
    weights.unlink()
    assert hub.cached_model_path("test/tiny-target") is None
    fake_hub.log.clear()
    plan = hub.plan_download("test/tiny-target")
    size = (tiny_model_folder / weights.name).stat().st_size
    assert (plan.files, plan.download_bytes) == (1, size)
    code, out, err = cli(capsys, "pull", "test/tiny-target")
    assert code == 0, err
    fetched = [
        path.rsplit("/", 1)[1]
        for method, path, _ in fake_hub.log
        if method == "GET" and "/resolve/" in path
    ]
    assert fetched == ["model.safetensors"]
    assert weights.read_bytes() == (tiny_model_folder / weights.name).read_bytes()


def test_a_dropped_connection_resumes_where_it_stopped(
    capsys, fake_hub, tiny_model_folder, hf_cache, monkeypatch
):
    monkeypatch.setattr("huggingface_hub.constants.DOWNLOAD_CHUNK_SIZE", 4096)  # not 10 MB
    fake_hub.add("test/tiny-target", tiny_model_folder)
    fake_hub.cut_once.add("model.safetensors")
    code, _, err = cli(capsys, "pull", "test/tiny-target")
    assert code == 0, err
    ranges = [
        r
        for method, path, r in fake_hub.log
        if method == "GET" and path.endswith("/model.safetensors")
    ]
    size = (tiny_model_folder / "model.safetensors").stat().st_size
    assert ranges[0] is None and len(ranges) == 2  # the second request resumes midway
    assert ranges[1].startswith("bytes=") and 0 < int(ranges[1][6:-1]) <= size // 2
    snapshot = hub.cached_model_path("test/tiny-target")
    assert (snapshot / "model.safetensors").read_bytes() == (
        tiny_model_folder / "model.safetensors"
    ).read_bytes()


def test_pull_checks_the_real_sizes_against_free_disk(
    capsys, fake_hub, tiny_model_folder, hf_cache, monkeypatch
):
    fake_hub.add("test/tiny-target", tiny_model_folder)
    monkeypatch.setattr(hub, "free_disk_bytes", lambda path: 1000)
    code, out, err = cli(capsys, "pull", "test/tiny-target")
    assert code == 2 and out == ""
    assert err.startswith("macspec: error: not enough disk space for test/tiny-target: needs")
    assert not hf_cache.exists()  # asking the hub wrote nothing


def test_pull_of_a_repo_the_hub_does_not_have(capsys, fake_hub, hf_cache):
    code, _, err = cli(capsys, "pull", "test/nothere")
    assert code == 2
    assert err == (
        "macspec: error: test/nothere: no such model on the Hugging Face hub (or it is private)\n"
    )
