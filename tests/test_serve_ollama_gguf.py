"""What Ollama's listings (/api/tags, /api/show, /api/ps) say of a served GGUF file: format
gguf, the file type llama.cpp names (`general.file_type`, else the commonest tensor type),
the family `general.architecture` names, and the file's stem as the model's name."""

from __future__ import annotations

from functools import partial
from types import SimpleNamespace

import pytest
import tiny
from gguf import GGMLQuantizationType as Q
from ggufkit import write_gguf

from macspec.models import hub
from macspec.models.loader import load_model
from macspec.serve.backend import Backend
from macspec.serve.errors import APIError
from macspec.serve.model_names import accepted_names
from macspec.serve.ollama_models import ServedModel

Q4_1_FILE = 3
"""llama.cpp's LLAMA_FTYPE_MOSTLY_Q4_1."""


def served(tmp_path, name: str, kind: Q, meta: dict | None) -> ServedModel:
    """A tiny Gemma 3 GGUF as `macspec serve --model PATH` serves it."""
    shape = dict(num_hidden_layers=6, sliding_window_pattern=6, tie_word_embeddings=True)
    config = tiny.arch_config("gemma3_text", **shape)  # llama.cpp's pattern: every 6th global
    model = tiny.arch_model("gemma3_text", 1, **shape)
    model.pop("lm_head")  # tied: llama.cpp's converter writes no output.weight
    path = write_gguf(model, config, tmp_path / name, float_type=kind, meta=meta)
    folder = hub.local_model_path(str(path))
    model, _ = load_model(folder, "model")
    backend = SimpleNamespace(
        model_id=path.stem,
        context_length=4096,
        aliases=accepted_names(path.stem, (str(path), str(folder))),
        any_model=False,
        engine=SimpleNamespace(target=SimpleNamespace(model=model)),
    )
    backend.check_model = partial(Backend.check_model, backend)  # the names, as served
    return ServedModel(backend)


def test_a_gguf_file_is_described_as_ollama_describes_it(tmp_path):
    model = served(tmp_path, "gemma-3-tiny-q4_1.gguf", Q.Q4_1, {"general.file_type": Q4_1_FILE})
    details = model.details()
    assert details["format"] == "gguf"
    assert details["quantization_level"] == "Q4_1"
    assert details["family"] == "gemma3" and details["families"] == ["gemma3"]
    assert model.model_info()["general.architecture"] == "gemma3"
    assert model.listing()["name"] == model.running()["model"] == "gemma-3-tiny-q4_1:latest"
    for name in (
        "gemma-3-tiny-q4_1",
        "gemma-3-tiny-q4_1:latest",
        str(tmp_path / "gemma-3-tiny-q4_1.gguf"),
    ):
        model.check(name)  # the stem, tagged or not, and the path all name it
    with pytest.raises(APIError):
        model.check("gemma-3-other")


def test_without_a_file_type_the_commonest_tensor_type_is_the_level(tmp_path):
    details = served(tmp_path, "plain.gguf", Q.Q8_0, None).details()
    assert details["quantization_level"] == "Q8_0" and details["format"] == "gguf"


def test_serve_lists_a_gguf_file_by_its_name_on_every_api(tmp_path):
    """`macspec serve --model DIR/NAME.gguf`: /v1/models (and so Ollama's /api/tags) lists
    NAME, and the path a client was configured with still reaches the model."""
    from ggufkit import tiny_gguf

    from macspec.cli.serve import served_names
    from macspec.models.catalog import resolve_models

    path = tiny_gguf(tmp_path, Q.Q8_0)
    model_id, aliases = served_names(resolve_models(None, str(path), None))
    assert model_id == path.stem and "/" not in model_id
    assert str(path) in aliases
