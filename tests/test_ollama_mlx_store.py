"""Ollama's MLX models in the listing and in faults: described from their layers (size,
quantization, architecture, fits, drafts), paired like other MLX models; a manifest whose blobs
are missing or cut, or whose architecture mlx-lm lacks, is one line at `--model` and a row that
says why; nothing in the store is ever written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ollamamlxkit import write_model
from storekit import OllamaStore
from test_cli_faults import assert_one_line, run_cli
from tiny import arch_config, arch_model, save_arch_model

from macspec.errors import MacspecError
from macspec.models import hub
from macspec.models.stores.listing import local_models
from macspec.models.stores.pairing import drafts_for, resolve_auto


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> OllamaStore:
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "ollama"))
    monkeypatch.setenv("MACSPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("HOME", str(tmp_path))  # no LM Studio store
    return OllamaStore(tmp_path / "ollama")


def store_files(root: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def tensor_blob(manifest: Path, root: Path, name: str) -> Path:
    layers = json.loads(manifest.read_text())["layers"]
    digest = next(layer["digest"] for layer in layers if layer.get("name") == name)
    return root / "blobs" / digest.replace(":", "-")


def test_the_listing_describes_an_mlx_manifest(store, tmp_path):
    config = arch_config("qwen3")
    write_model(store, "tiny:int4", arch_model("qwen3", 0), config, "int4", tmp_path / "r")
    (found,) = local_models()
    about = found.about
    assert found.error is None and found.name == "tiny:int4" and about is not None
    assert (about.format, about.quantization, about.architecture) == ("mlx", "int4", "qwen3")
    assert about.context_length == 4096 and about.memory is not None
    blobs = {
        p for p in (store.root / "blobs").iterdir() if p.stat().st_size > 2000
    }  # the tensors (the JSON blobs are smaller)
    assert 0 < about.size_bytes <= sum(p.stat().st_size for p in blobs) + 100_000
    assert about.carried_drafts == ()


def test_a_smaller_mlx_folder_drafts_for_it(store, tmp_path, monkeypatch):
    """Pairing by tokenizer: an MLX folder (same tokenizer files) pairs with the manifest."""
    target = arch_model("qwen3", 0, num_hidden_layers=8, intermediate_size=512)
    config = arch_config("qwen3", num_hidden_layers=8, intermediate_size=512)
    write_model(store, "big:bf16", target, config, None, tmp_path / "r")
    small = save_arch_model(arch_model("qwen3", 1), tmp_path / "small")
    models = local_models()
    (big,) = [m for m in models if m.name == "big:bf16"]
    from macspec.models.stores.listing import describe_path

    other = type(big)(str(small), "given", small, describe_path(small))
    assert drafts_for(big, [*models, other]) == [other]
    # `--draft-model auto` of the resolved target describes it from its manifest
    monkeypatch.setattr("macspec.models.stores.pairing.local_models", lambda: [*models, other])
    assert resolve_auto("big:bf16", hub.local_model_path("big:bf16"))[0] == str(small)


def damage_missing(manifest: Path, root: Path) -> str:
    tensor_blob(manifest, root, "model.layers.0.mlp.up_proj.weight").unlink()
    return "is missing"


def damage_cut(manifest: Path, root: Path) -> str:
    blob = tensor_blob(manifest, root, "model.layers.0.mlp.up_proj.weight")
    blob.write_bytes(blob.read_bytes()[:-100])
    return "is cut"


@pytest.mark.parametrize("damage", [damage_missing, damage_cut])
def test_a_damaged_manifest_is_one_line_and_a_row(store, tmp_path, damage, capsys, monkeypatch):
    written = write_model(
        store, "tiny:q", arch_model("qwen3", 0), arch_config("qwen3"), "int4", tmp_path / "r"
    )
    needle = damage(written.manifest, store.root)
    before = store_files(store.root)
    with pytest.raises(MacspecError, match=needle):
        hub.local_model_path("tiny:q")
    (row,) = local_models()
    assert row.about is None and needle in row.error
    code, _, err = run_cli(capsys, monkeypatch, "run", "hi", "--model", "tiny:q")
    assert_one_line(code, err, needle)
    assert store_files(store.root) == before


def test_an_architecture_mlx_lm_lacks_is_one_line(store, tmp_path, capsys, monkeypatch):
    config = {**arch_config("qwen3"), "model_type": "no_such_arch"}
    write_model(store, "odd:q", arch_model("qwen3", 0), config, "int4", tmp_path / "r")
    before = store_files(store.root)
    (row,) = local_models()
    assert "architecture no_such_arch" in row.error
    code, _, err = run_cli(capsys, monkeypatch, "run", "hi", "--model", "ollama:odd:q")
    assert_one_line(code, err, "architecture no_such_arch is not one mlx-lm builds")
    assert store_files(store.root) == before


def test_a_blob_gone_after_the_folder_was_derived_is_one_line(store, tmp_path):
    written = write_model(
        store, "tiny:q", arch_model("qwen3", 0), arch_config("qwen3"), "int4", tmp_path / "r"
    )
    hub.local_model_path("tiny:q")  # derived
    damage_missing(written.manifest, store.root)
    with pytest.raises(MacspecError, match="is missing; pull it again"):
        hub.local_model_path("tiny:q")


def test_the_listing_names_a_carried_draft(store, tmp_path, capsys, monkeypatch):
    from dflashkit import dflash_config

    from macspec.engine.drafters.dflash import DFlashConfig, DFlashModel

    config = dflash_config(target_layer_ids=(0, 1))
    drafter = DFlashModel(DFlashConfig.from_dict(config), 64)
    draft = (drafter, config)
    target = arch_model("qwen3", 0)
    write_model(
        store, "t:dflash", target, arch_config("qwen3"), "int4", tmp_path / "r", draft=draft
    )
    (row,) = local_models()
    assert row.about is not None and row.about.carried_drafts == ("dflash",)
    code, out, err = run_cli(capsys, monkeypatch, "models", "--local", "--json")
    assert code == 0, err
    (entry,) = [e for e in json.loads(out) if e["name"] == "t:dflash"]
    assert entry["carried_drafts"] == ["dflash"] and entry["architecture"] == "qwen3"


def test_nvfp4_with_a_global_scale_is_nvfp4_per_module():
    """ModelOpt's nvfp4 keeps a global scale: its module is nvfp4, the scale loaded beside."""
    from macspec.models.stores.ollama_mlx import module_quantization

    header = {
        "__metadata__": {"quant_type": "nvfp4", "group_size": "16"},
        "a.weight": {},
        "a.weight.scale": {},
        "a.weight.global_scale": {},
    }
    assert module_quantization(header, "m:q") == {
        "a": {"group_size": 16, "bits": 4, "mode": "nvfp4"}
    }
