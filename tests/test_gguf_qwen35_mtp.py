"""A Qwen3.5 GGUF file's own MTP layer (tests/oracle_qwen35.py writes it as _QwenMtpMixin
does) as macspec's MTP drafter: its weights are the checkpoint's `mtp.*` converted as an MLX
head's, `--draft mtp` is lossless, and a file without one says so in one line."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import mlx.core as mx
import oracle_qwen35
import pytest
from oraclekit import ARCHS, write_tiny_gguf
from test_cli_faults import run_cli

from macspec.models import hub
from macspec.models.build import drafter_folders
from macspec.models.catalog import ResolvedModels
from macspec.models.drafters import drafter_kind, load_mtp, read_config, sanitize_mtp
from macspec.models.gguf.layout import Layout
from macspec.models.gguf.mtp import gguf_mtp_head
from macspec.models.resolved import carried_head
from macspec.models.stores.describe import describe_gguf

HEAD_NAMES = {
    "eh_proj": "fc",
    "enorm": "pre_fc_norm_embedding",
    "hnorm": "pre_fc_norm_hidden",
    "shared_head.norm": "norm",
}
"""_QwenMtpMixin.filter_tensors' renames, undone."""


def checkpoint_mtp(name: str) -> dict[str, mx.array]:
    """The `mtp.*` tensors of the checkpoint the oracle wrote `name`'s file from."""
    spec = ARCHS[name]
    block = f"model.layers.{spec.config['num_hidden_layers']}."
    out = {}
    for hf_name, array in oracle_qwen35.hf_weights(spec.config, spec.seed):
        if hf_name.startswith(block):
            part, _, kind = hf_name.removeprefix(block).rpartition(".")
            own = HEAD_NAMES.get(part)
            out[f"mtp.{own}.{kind}" if own else f"mtp.layers.0.{part}.{kind}"] = mx.array(array)
    return out


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("mtp")
    for name in ("qwen35", "qwen35moe"):
        write_tiny_gguf(name, root / name)
    without = replace(
        ARCHS["qwen35"], config={**ARCHS["qwen35"].config, "mtp_num_hidden_layers": 0}
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(ARCHS, "qwen35", without)
        write_tiny_gguf("qwen35", root / "nomtp")
    return root


@pytest.fixture
def root(files: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MACSPEC_HOME", str(files / "home"))
    return files


@pytest.mark.parametrize("name", ["qwen35", "qwen35moe"])
def test_the_head_is_the_checkpoints_mtp_tensors(root, name):
    folder = hub.local_model_path(str(root / name / f"{name}.gguf"))
    want = sanitize_mtp(checkpoint_mtp(name))  # names, norms + 1, experts stacked
    for layout in Layout:
        head = gguf_mtp_head(folder, layout)
        assert head is not None and drafter_kind(head) == "mtp"
        got = mx.load(str(head / "model.safetensors"))
        assert sorted(got) == sorted(want)
        assert all(mx.array_equal(got[k], want[k]) for k in want), layout
    assert read_config(head)["text_config"]["mtp_num_hidden_layers"] == 1
    load_mtp(head, read_config(folder))  # as a published MTP folder: norms about 1
    assert describe_gguf(root / name / f"{name}.gguf").carried_drafts == ("mtp",)
    resolved = ResolvedModels(folder, None, name, None, None)
    assert drafter_folders(resolved, "auto") == {"mtp": folder / "mtp"}  # the default layout's


def test_draft_mtp_is_the_targets_own_greedy_answer(root, capsys, monkeypatch):
    path = str(root / "qwen35" / "qwen35.gguf")
    base = ["run", "The quick brown fox", "--model", path, "--json", "--max-tokens", "12"]
    records = {}
    for flags in (("--no-draft",), ("--draft", "mtp", "-k", "3")):
        code, out, err = run_cli(capsys, monkeypatch, *base, *flags)
        assert code == 0 and "MTP" not in err, err  # no notice of a layer not used
        records[flags[-1]] = json.loads(out)
    plain, drafted = records["--no-draft"], records["3"]
    assert drafted["drafter"] == "mtp" and drafted["tokens"] == plain["tokens"]
    assert drafted["stats"]["draft_proposed"] > 0 and len(plain["tokens"]) == 12


def test_a_file_without_an_mtp_layer_has_no_head(root, capsys, monkeypatch):
    path = root / "nomtp" / "qwen35.gguf"
    assert carried_head(hub.local_model_path(str(path)), "mtp") is None
    assert describe_gguf(path).carried_drafts == ()
    args = ["run", "Hi", "--model", str(path), "--max-tokens", "2", "--draft", "mtp"]
    code, _, err = run_cli(capsys, monkeypatch, *args)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "an MTP head" in err
