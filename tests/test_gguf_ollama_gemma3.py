"""A Gemma 3 GGUF as Ollama's own converter writes a multimodal checkpoint (ollama/ollama
convert/convert_gemma3.go): `gemma3.vision.*` and `gemma3.mm.tokens_per_image` keys, the vision
tower's `v.*` and the projector's `mm.*` tensors in the same file, and without the keys Ollama's
engine defaults (RMS epsilon, rope base). The text model gives exactly the logits of the same
file without them; the vision tensors are neither read nor counted; a load says so in one line."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType, GGUFWriter
from ggufkit import write_gguf
from test_gguf_files import CONFIGS, PROMPT, random_model

from macspec.errors import MacspecError
from macspec.models import hub
from macspec.models.gguf.layout import Layout
from macspec.models.gguf.split import read_model_header
from macspec.models.gguf.tensors import resident_bytes
from macspec.models.loader import load_model, load_models

OMITTED = ("gemma3.attention.layer_norm_rms_epsilon", "gemma3.rope.freq_base")
"""Keys convert_gemma3.go does not write for a multimodal checkpoint (its engine's defaults:
1e-6 and 1e6, the tiny model's own values)."""
VISION_KEYS = {
    "gemma3.vision.block_count": 1,
    "gemma3.vision.embedding_length": 32,
    "gemma3.vision.feed_forward_length": 64,
    "gemma3.vision.image_size": 28,
    "gemma3.vision.patch_size": 14,
    "gemma3.vision.num_channels": 3,
    "gemma3.vision.attention.head_count": 2,
    "gemma3.mm.tokens_per_image": 4,
}
VISION_TENSORS = {
    "v.patch_embd.weight": (32, 3, 14, 14),
    "v.position_embd.weight": (4, 32),
    "v.blk.0.attn_q.weight": (32, 32),
    "v.blk.0.ln1.weight": (32,),
    "v.post_layernorm.weight": (32,),
    "mm.mm_input_projection.weight": (32, 64),
    "mm.mm_soft_emb_norm.weight": (32,),
}


def as_ollama_writes_it(
    source: Path, path: Path, local: list[bool] | None = None, softcap: float = 0.0
) -> Path:
    """`source` rewritten as convert_gemma3.go writes a multimodal checkpoint (the vision
    tower's keys and tensors, without `OMITTED`), or with `local`, a text-only one (its
    `attention.sliding_window_pattern`: one bool per layer, true where it is local)."""
    reader = GGUFReader(source)
    writer = GGUFWriter(str(path), "gemma3")
    vision = local is None
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        if vision and name in OMITTED:
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), kind, sub_type=sub)
    if not vision:
        writer.add_array("gemma3.attention.sliding_window_pattern", local)
    if softcap:
        writer.add_float32("gemma3.final_logit_softcapping", softcap)
    rng = np.random.default_rng(0)
    for name, shape in VISION_TENSORS.items() if vision else ():  # the tower first, as Ollama's
        writer.add_tensor(name, rng.normal(size=shape).astype(np.float32))
    for name, value in VISION_KEYS.items() if vision else ():
        writer.add_uint32(name, value)
    for tensor in reader.tensors:
        shape = tuple(int(n) for n in reversed(tensor.shape))
        writer.add_tensor(tensor.name, np.asarray(tensor.data).reshape(shape))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_ollamas_multimodal_gemma3_runs_its_text_model(tmp_path):
    config = CONFIGS["gemma3_text"]
    plain = write_gguf(random_model(config, seed=4), config, tmp_path / "plain.gguf")
    ollama = as_ollama_writes_it(plain, tmp_path / "ollama.gguf")
    assert not set(OMITTED) & set(GGUFReader(ollama).fields)
    ids = mx.array([PROMPT])
    expected, _ = load_model(hub.local_model_path(str(plain)), "model")
    model, _ = load_model(hub.local_model_path(str(ollama)), "model")
    assert mx.array_equal(model(ids), expected(ids))


def test_the_vision_tower_is_neither_read_nor_counted(tmp_path):
    config = CONFIGS["gemma3_text"]
    plain = write_gguf(random_model(config, seed=4), config, tmp_path / "plain.gguf")
    ollama = as_ollama_writes_it(plain, tmp_path / "ollama.gguf")
    header = read_model_header(ollama)
    assert not [name for name in header.tensors if name.startswith(("v.", "mm."))]
    assert header.tensors.keys() == read_model_header(plain).tensors.keys()
    plain_header = read_model_header(plain)
    assert resident_bytes(header, Layout.COMPACT) == resident_bytes(plain_header, Layout.COMPACT)


def test_a_load_says_the_image_part_is_not_used_in_one_line(tmp_path):
    config = CONFIGS["gemma3_text"]
    plain = write_gguf(random_model(config, seed=4), config, tmp_path / "plain.gguf")
    ollama = as_ollama_writes_it(plain, tmp_path / "ollama.gguf")
    for _ in range(2):  # the derived folder's first load and a later one
        loaded = load_models(hub.local_model_path(str(ollama)))
        assert loaded.warnings == [
            "ollama.gguf carries Gemma 3's vision tower: the text model runs, the image part "
            "is not used yet"
        ]
    assert load_models(hub.local_model_path(str(plain))).warnings == []


def test_ollamas_text_only_gemma3_says_its_window_pattern(tmp_path):
    config = CONFIGS["gemma3_text"]  # every 6th layer global
    plain = write_gguf(random_model(config, seed=4), config, tmp_path / "plain.gguf")
    ollama = as_ollama_writes_it(plain, tmp_path / "ollama.gguf", [True] * 5 + [False])
    ids = mx.array([PROMPT])
    expected, _ = load_model(hub.local_model_path(str(plain)), "model")
    model, _ = load_model(hub.local_model_path(str(ollama)), "model")
    assert mx.array_equal(model(ids), expected(ids))
    odd = as_ollama_writes_it(plain, tmp_path / "odd.gguf", [True, False, True, True, True, False])
    with pytest.raises(MacspecError, match="sliding-window pattern that is not one global layer"):
        hub.local_model_path(str(odd))


def test_a_final_logit_softcap_is_one_line(tmp_path):
    """llama.cpp applies it, mlx-lm's gemma3_text does not: refused, not run otherwise."""
    config = CONFIGS["gemma3_text"]
    plain = write_gguf(random_model(config, seed=4), config, tmp_path / "plain.gguf")
    capped = as_ollama_writes_it(plain, tmp_path / "capped.gguf", [True] * 5 + [False], 30.0)
    with pytest.raises(MacspecError, match=r"a final logit softcap \(30\) is not supported yet"):
        hub.local_model_path(str(capped))
