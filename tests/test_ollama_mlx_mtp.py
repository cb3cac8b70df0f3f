"""The MTP head inside an Ollama MLX model's own weights (Qwen3.5's `mtp.*` tensor layers,
stored as a Hugging Face checkpoint holds them: norms centred on 0, x/models/qwen3_5's
loadMTPHead): macspec's MTP drafter, taken by `--draft mtp` and `--draft auto`, listed by
`macspec models`; greedy tokens are the target alone's."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import pytest
from mlx_lm import load as mlx_load
from ollamamlxkit import write_model
from storekit import OllamaStore
from test_cli_faults import run_cli
from tiny import arch_config, arch_model, mtp_weights, near_bigram

from macspec.models import hub
from macspec.models.build import drafter_folders
from macspec.models.catalog import ResolvedModels
from macspec.models.drafters import NORM_SUFFIXES, drafter_kind, load_mtp
from macspec.models.loader import load_model
from macspec.models.resolved import carried_head

SHIFTED = (
    ".input_layernorm.weight",
    ".post_attention_layernorm.weight",
    "model.norm.weight",
    ".q_norm.weight",
    ".k_norm.weight",
)
"""The trunk's norms a Hugging Face Qwen3.5 checkpoint keeps centred on 0 (mlx-lm's sanitize)."""


def hugging_face_layout(name: str, weight: mx.array) -> mx.array:
    """A trunk tensor as an import from the original checkpoint stores it."""
    if "conv1d.weight" in name:
        return weight.moveaxis(1, 2)  # [C, 1, K], as Hugging Face's Conv1d holds it
    if name.endswith(SHIFTED) and weight.ndim == 1:
        return weight - 1.0
    return weight


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The store (written once for the module) and the reference beside it."""
    root = tmp_path_factory.mktemp("mtp")
    store = OllamaStore(root / "ollama")
    target = near_bigram(arch_model("qwen3_5", 0, scale=3.0), mix=0.02)
    head = {
        f"mtp.{k}": v - 1.0 if k.endswith(NORM_SUFFIXES) and v.ndim == 1 else v
        for k, v in mtp_weights(target, 0.005).items()
    }
    config = arch_config("qwen3_5")
    write_model(
        store,
        "q35:mtp",
        target,
        config,
        "int4",
        root / "ref",
        as_stored=hugging_face_layout,
        extra=head,
    )
    return root


@pytest.fixture
def root(written: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("OLLAMA_MODELS", str(written / "ollama"))
    monkeypatch.setenv("MACSPEC_HOME", str(written / "home"))  # derived once, shared
    monkeypatch.setenv("HF_HUB_CACHE", str(written / "hf"))
    monkeypatch.setenv("HOME", str(written))  # no LM Studio store
    return written


def test_the_targets_own_mtp_head_is_an_mtp_drafter(root):
    folder = hub.local_model_path("q35:mtp")
    model, _ = load_model(folder, "model")
    want, _ = mlx_load(str(root / "ref"))
    prompt = mx.array([[5, 72, 101, 108, 108, 111]])
    assert mx.array_equal(model(prompt), want(prompt))  # the mtp.* tensors left to the head
    head_folder = carried_head(folder, "mtp")
    assert head_folder is not None and drafter_kind(head_folder) == "mtp"
    assert not list(head_folder.glob("*.safetensors"))  # its weights stay in the blobs
    head = load_mtp(head_folder, arch_config("qwen3_5"))
    assert head.fc.bits == 4  # quantized as Ollama stored it
    assert mx.allclose(head.pre_fc_norm_embedding.weight, mx.ones(64))  # shifted once
    resolved = ResolvedModels(folder, None, "q35:mtp", None, None)
    assert drafter_folders(resolved, "auto") == {"mtp": head_folder}  # --draft auto's choice


def test_drafting_with_the_carried_mtp_head_is_lossless(root, capsys, monkeypatch):
    base = ["run", "The quick brown fox", "--model", "q35:mtp", "--json", "--max-tokens", "16"]
    code, out, err = run_cli(capsys, monkeypatch, *base, "--no-draft")
    assert code == 0, err
    plain = json.loads(out)
    code, out, err = run_cli(capsys, monkeypatch, *base, "--draft", "mtp", "-k", "3")
    assert code == 0, err
    record = json.loads(out)
    assert record["drafter"] == "mtp" and record["tokens"] == plain["tokens"]
    assert record["stats"]["draft_proposed"] > 0
    code, out, err = run_cli(capsys, monkeypatch, "models", "--local", "--json")
    assert code == 0, err
    (entry,) = [e for e in json.loads(out) if e["name"] == "q35:mtp"]
    assert entry["carried_drafts"] == ["mtp"] and entry["architecture"] == "qwen3_5"
