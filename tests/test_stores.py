"""Store names: Ollama's and LM Studio's stores resolved to the files they hold, in place, and
every bad name one line. The stores are built in tmp (HOME and OLLAMA_MODELS point there)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from storekit import OllamaStore, lmstudio_repo, tiny_gguf

from macspec.errors import MacspecError
from macspec.models import hub, stores
from macspec.models.catalog import resolve_models
from macspec.models.stores import ollama

pytestmark = pytest.mark.usefixtures("gguf_as_files")


@pytest.fixture
def user() -> Path:
    home = Path(os.environ["HOME"])  # conftest: a temp folder
    home.mkdir(parents=True, exist_ok=True)
    return home


@pytest.fixture
def store(user: Path) -> OllamaStore:
    return OllamaStore(user / ".ollama" / "models")  # the default, no OLLAMA_MODELS


@pytest.fixture
def gguf_file(tmp_path: Path) -> Path:
    return tiny_gguf(tmp_path / "files" / "tiny.gguf")


def one_line_error(name: str) -> str:
    with pytest.raises(MacspecError) as info:
        hub.local_model_path(name)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_ollama_names_resolve_to_the_model_blob(store, gguf_file):
    store.add("qwen3:8b", gguf_file)
    store.add("smol", gguf_file)  # tag left out: latest
    store.add("tool:1b", gguf_file, namespace="someone")
    blob = hub.local_model_path("ollama:qwen3:8b")
    assert blob.parent == store.root / "blobs" and blob.name.startswith("sha256-")
    assert blob.read_bytes() == gguf_file.read_bytes()
    for name in (
        "qwen3:8b",  # bare NAME:TAG, as Ollama's CLI takes it
        "ollama:QWEN3:8B",  # Ollama matches names ignoring case
        "ollama:registry.ollama.ai/library/qwen3:8b",
        "ollama:smol",
        "smol:latest",
        "ollama:someone/tool:1b",
        "someone/tool:1b",
    ):
        assert hub.local_model_path(name).read_bytes() == gguf_file.read_bytes(), name


def test_ollama_models_moves_the_store(monkeypatch, tmp_path, gguf_file):
    moved = OllamaStore(tmp_path / "elsewhere")
    moved.add("qwen3:0.6b", gguf_file)
    monkeypatch.setenv("OLLAMA_MODELS", str(moved.root))
    assert hub.local_model_path("qwen3:0.6b").parent == moved.root / "blobs"


def test_params_are_defaults_and_a_projector_is_a_note(store, gguf_file):
    params = {"stop": ["<|im_end|>"], "temperature": 0.6, "top_k": 20}
    projector = {"mediaType": ollama.PROJECTOR, **store.blob(b"GGUF-projector")}
    store.add("vision:4b", gguf_file, params=params, extra=[projector])
    found = stores.find("vision:4b")
    assert found is not None and found.params == params
    resolved = resolve_models(None, "ollama:vision:4b", None)
    assert resolved.store_params == params
    assert resolved.target == found.path
    assert any("images are not read" in note for note in resolved.notes)
    store.add("plain:1b", gguf_file)
    assert resolve_models(None, "plain:1b", None).notes == ()


def test_a_manifest_draft_layer_is_kept(store, gguf_file, tmp_path):
    draft = tiny_gguf(tmp_path / "files" / "draft.gguf", rows=4)
    layer = {"mediaType": ollama.DRAFT, **store.blob_file(draft)}
    store.add("paired:8b", gguf_file, extra=[layer])
    found = stores.find("paired:8b")
    assert found.draft is not None and found.draft.read_bytes() == draft.read_bytes()


def test_a_tensor_layer_manifest_without_its_config_is_one_line(store):
    """An MLX manifest (test_ollama_mlx*.py read whole ones) needs its config.json layer."""
    tensor = {"mediaType": ollama.TENSOR, "name": "model.embed_tokens.weight", **store.blob(b"x")}
    store.add("new:1b", None, extra=[tensor])
    assert "has no config.json layer" in one_line_error("ollama:new:1b")


def test_bad_ollama_entries_are_one_line_each(store, gguf_file, user):
    missing = store.add("gone:1b", gguf_file)
    digest = json.loads(missing.read_text())["layers"][0]["digest"]
    (store.root / "blobs" / digest.replace(":", "-")).unlink()
    assert "model blob" in one_line_error("gone:1b") and "is missing" in one_line_error("gone:1b")

    text = Path(store.root / "text.bin")
    text.write_bytes(b"not a model at all")
    store.add("notgguf:1b", text)
    assert "is not a GGUF file" in one_line_error("notgguf:1b")

    broken = store.add("broken:1b", gguf_file)
    broken.write_text("{not json")
    assert "cannot read its manifest" in one_line_error("ollama:broken:1b")

    store.add("qwen3:8b", gguf_file)
    message = one_line_error("qwen3:7b")
    assert "not in Ollama's store" in message and "nearest: qwen3:8b" in message
    assert "ollama pull llama9:1b" in one_line_error("ollama:llama9:1b")


def test_a_missing_ollama_store_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "nowhere"))
    message = one_line_error("ollama:qwen3:8b")
    assert "does not exist" in message and "nowhere" in message


def test_lmstudio_gguf_files_side_by_side(user, tmp_path):
    folder = lmstudio_repo(user, "lmstudio-community", "Qwen3-8B-GGUF")
    q4 = tiny_gguf(folder / "Qwen3-8B-Q4_K_M.gguf")
    q8 = tiny_gguf(folder / "Qwen3-8B-Q8_0.gguf", rows=4)
    message = one_line_error("lmstudio:lmstudio-community/Qwen3-8B-GGUF")
    assert "Qwen3-8B-Q4_K_M.gguf" in message and "Qwen3-8B-Q8_0.gguf" in message
    named = "lmstudio:lmstudio-community/Qwen3-8B-GGUF/Qwen3-8B-Q8_0.gguf"
    assert hub.local_model_path(named) == q8
    q8.unlink()
    tiny_gguf(folder / "mmproj-model-f16.gguf")  # a projector is no candidate, but a note
    found = stores.find("lmstudio:lmstudio-community/Qwen3-8B-GGUF")
    assert found.path == q4 and any("images are not read" in n for n in found.notes)
    assert "is missing" in one_line_error(named)


def test_lmstudio_mlx_folders_and_the_older_store(user, tiny_model_folder):
    import shutil

    older = lmstudio_repo(user, "mlx-community", "tiny-4bit", older=True)
    shutil.copytree(tiny_model_folder, older, dirs_exist_ok=True)
    assert hub.local_model_path("lmstudio:mlx-community/tiny-4bit") == older
    newer = lmstudio_repo(user, "mlx-community", "tiny-4bit")
    shutil.copytree(tiny_model_folder, newer, dirs_exist_ok=True)
    found = stores.find("lmstudio:mlx-community/tiny-4bit")
    assert found.path == newer and any(str(newer) in note for note in found.notes)
    empty = lmstudio_repo(user, "someone", "empty")
    assert "no GGUF file and no MLX model" in one_line_error("lmstudio:someone/empty")
    assert empty.is_dir()


@pytest.mark.parametrize(
    "name",
    ["lmstudio:foo/bar", "lmstudio:foo", "lmstudio:a/../b", "a:b/c", "", "x", "org/--bad", "a b"],
)
def test_malformed_names_say_what_was_given_and_the_forms(name):
    message = one_line_error(name)
    assert f"{name}" in message
    if not name.startswith("lmstudio:"):
        assert "ollama:NAME[:TAG]" in message and "lmstudio:PUBLISHER/REPO" in message


def test_files_and_folders_that_are_no_model(tmp_path, gguf_file):
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    assert "a file that is not GGUF" in one_line_error(str(text))
    assert "no config.json" in one_line_error(str(tmp_path))
    assert hub.local_model_path(str(gguf_file)) == gguf_file  # a GGUF file is taken as is
    assert "no such model folder" in one_line_error(str(tmp_path / "absent"))


def test_hf_ids_and_store_names_do_not_collide():
    assert hub.is_repo_id("mlx-community/Qwen3-8B-4bit")
    for name in ("qwen3:8b", "lmstudio:foo/bar", "a:b/c", "org/--bad"):
        assert not hub.is_repo_id(name)
    assert stores.is_store_name("qwen3:8b") and not stores.is_store_name("org/name")


@pytest.mark.parametrize("command", ["run", "chat", "serve"])
@pytest.mark.parametrize("flag", ["--model", "--draft-model"])
@pytest.mark.parametrize("name", ["lmstudio:foo/bar", "a:b/c", ""])
def test_every_command_refuses_a_bad_name_in_one_line(
    capsys, tiny_model_folder, command, flag, name
):
    from macspec.cli import main

    argv = [command, "--model", str(tiny_model_folder), "--draft-model", name]
    if flag == "--model":
        argv = [command, "--model", name]
    argv += ["hi"] if command == "run" else []
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("macspec: error: ")
    assert "Traceback" not in err and name in err


def test_an_unknown_name_suggests_the_nearest_store_names(store, gguf_file, user):
    store.add("qwen3:8b", gguf_file)
    store.add("qwen3:0.6b", gguf_file)
    lmstudio_repo(user, "lmstudio-community", "gemma-3-270m-it-GGUF")
    assert "on this Mac: qwen3:0.6b, qwen3:8b" in one_line_error("qwen3")
    assert "on this Mac: qwen3:8b" in one_line_error("qwen3-8b")
    gemma = "on this Mac: lmstudio:lmstudio-community/gemma-3-270m-it-GGUF"
    assert gemma in one_line_error("gemma-3-270m-it-GGUF")
    assert "on this Mac" not in one_line_error("llama")


def test_a_bare_name_is_its_latest_tag_as_in_ollama(store, gguf_file, tiny_model_folder):
    store.add("smollm2:latest", gguf_file)
    store.add("smollm2:135m", tiny_gguf(gguf_file.parent / "other.gguf", rows=4))
    assert hub.local_model_path("smollm2").read_bytes() == gguf_file.read_bytes()
    resolved = resolve_models(None, "smollm2", str(tiny_model_folder))
    assert resolved.target.read_bytes() == gguf_file.read_bytes()
    assert "nearest: smollm2" in one_line_error("ollama:smollm2:7b")
    assert "is not a model name" in one_line_error("smollm")  # no smollm:latest: refused
