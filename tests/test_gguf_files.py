"""GGUF files of every architecture macspec reads, written here as llama.cpp's converter writes
them (names, Q/K permutation, Gemma's +1 norms, tied or untied output): read back, their logits
are the original model's. Every tensor type read gives `mx.load`'s arrays and `gguf`'s values.
Bad files are one line and exit 2, leaving nothing behind."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGUFWriter, quants
from gguf import GGMLQuantizationType as Q
from ggufkit import write_gguf, write_tiny_tokenizer
from mlx.utils import tree_flatten, tree_map, tree_map_with_path
from mlx_lm.utils import _get_classes
from tiny import VOCAB, tokenizer, write_tokenizer

from macspec.cli import main
from macspec.errors import MacspecError
from macspec.models import hub
from macspec.models.gguf.header import read_header
from macspec.models.gguf.layout import Layout
from macspec.models.gguf.tensors import read_tensors
from macspec.models.home import macspec_home
from macspec.models.loader import load_model

BASE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    rms_norm_eps=1e-6,
    vocab_size=VOCAB,
    max_position_embeddings=4096,
)
CONFIGS = {
    "llama": dict(BASE, model_type="llama", num_hidden_layers=2, tie_word_embeddings=False),
    "qwen2": dict(BASE, model_type="qwen2", num_hidden_layers=2, tie_word_embeddings=True),
    "qwen3": dict(
        BASE, model_type="qwen3", num_hidden_layers=2, head_dim=32, tie_word_embeddings=False
    ),
    "qwen3_moe": dict(  # Qwen3MoeModel: experts stacked per projection, a router
        BASE,
        model_type="qwen3_moe",
        num_hidden_layers=2,
        head_dim=16,
        tie_word_embeddings=False,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
    ),
    "gemma3_text": dict(
        BASE,
        model_type="gemma3_text",
        num_hidden_layers=6,  # llama.cpp's pattern: every 6th layer global
        head_dim=16,
        sliding_window=4,
        sliding_window_pattern=6,
        query_pre_attn_scalar=16,
        rope_theta=1_000_000.0,
    ),
}
CONFIGS["phi3"] = dict(  # Phi3MiniModel: fused qkv, gate_up; partial rotary; LongRoPE; tied
    BASE, model_type="phi3", num_hidden_layers=2, partial_rotary_factor=0.75,
    original_max_position_embeddings=64, tie_word_embeddings=True,
    rope_scaling=dict(type="longrope", long_factor=[1.0, 1.5, 2.0, 4.0, 8.0, 16.0],
                      short_factor=[1.0, 1.0, 1.2, 1.5, 2.0, 3.0]),
)  # fmt: skip
CONFIGS["gemma2"] = dict(  # Gemma2Model: +1 norms, both softcaps; 18 ids, inside any window
    BASE, model_type="gemma2", num_hidden_layers=2, head_dim=16, query_pre_attn_scalar=16,
    attn_logit_softcapping=2.0, final_logit_softcapping=15.0,
)  # fmt: skip
CONFIGS["gemma3_global"] = dict(CONFIGS["gemma3_text"], sliding_window_pattern=1)  # no window key
CONFIGS["llama3"] = dict(  # Llama 3.1's rope scaling: a rope_freqs tensor in the file
    CONFIGS["llama"],
    rope_scaling=dict(
        rope_type="llama3",
        factor=8.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=64,
    ),
)
for _config in CONFIGS.values():
    _config.setdefault("rope_theta", 10_000.0)
PROMPT = [256, 72, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100, 33, 10, 258, 65, 66, 67]


def random_model(config: dict, seed: int):
    model_class, args_class = _get_classes(config)
    mx.random.seed(seed)
    model = model_class(args_class.from_dict(config))

    def spread(path, w):  # norms away from their initial ones, biases away from zero
        return w + 0.3 * mx.random.normal(w.shape) if w.ndim == 1 else w * 3

    model.update(tree_map_with_path(spread, model.parameters()))
    if config["model_type"] == "gemma3_text":
        model.sanitize({})  # Gemma 3 ties its output to the embeddings, as its checkpoints do
    mx.eval(model.parameters())
    return model


def as_llamacpp_reads(config: dict, original):
    """The original model as llama.cpp runs its GGUF: a LongRoPE Phi rotated by its short
    factors (at contexts up to the original one; macspec's choice, docs/models.md)."""
    scaling = config.get("rope_scaling") or {}
    if scaling.get("type") != "longrope":
        return original
    short = dict(scaling, long_factor=scaling["short_factor"])
    return random_model(dict(config, rope_scaling=short), seed=1)  # the same weights


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """The tokenizer the tiny GGUFs' vocabulary was taken from, as its own folder."""
    folder = tmp_path_factory.mktemp("tokenizer")
    write_tokenizer(folder)
    return tokenizer(folder)


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_each_architecture_reads_back_as_the_original(kind, tmp_path, published):
    config = CONFIGS[kind]
    original = random_model(config, seed=1)
    path = write_gguf(original, config, tmp_path / f"{kind}.gguf")
    folder = hub.local_model_path(str(path))
    model, tokenizer_ = load_model(folder, "model")
    ids = mx.array([PROMPT])
    assert mx.allclose(model(ids), as_llamacpp_reads(config, original)(ids), atol=1e-4, rtol=1e-4)
    assert tokenizer_.eos_token_ids == {257}
    turns = [{"role": "user", "content": "héllo <|eos|> wörld 12"}]
    chat = tokenizer_.apply_chat_template(turns, add_generation_prompt=True)
    assert chat == published.apply_chat_template(turns, add_generation_prompt=True)
    assert tokenizer_.decode(chat) == published.decode(chat)


def test_quantized_layers_are_the_blocks_values(tmp_path):
    """Q8_0 and Q4_0 matrices, as a quantizing converter writes them: the model computes with
    exactly the values `gguf` dequantizes the blocks to."""
    config = CONFIGS["llama"]
    original = random_model(config, seed=2)
    for kind in (Q.Q8_0, Q.Q4_0, Q.Q4_1):
        path = write_gguf(original, config, tmp_path / f"{kind.name}.gguf", float_type=kind)
        model, _ = load_model(hub.local_model_path(str(path)), "model")
        header = read_header(path)
        for name, tensor in header.tensors.items():
            if tensor.qtype != kind:
                continue
            raw = np.fromfile(path, np.uint8, tensor.nbytes, offset=tensor.start)
            blocks = quants.dequantize(raw.reshape(tensor.shape[0], -1), kind)
            ours = dict(tree_flatten(model.parameters()))
            stem = _mlx_stem(name)
            if stem.endswith(("q_proj", "k_proj")):
                continue  # rows put back in order: compared through the logits below
            values = mx.dequantize(  # in float32, where scale * q + bias is exact
                ours[f"{stem}.weight"],
                ours[f"{stem}.scales"].astype(mx.float32),
                ours[f"{stem}.biases"].astype(mx.float32),
                32,
                8 if kind == Q.Q8_0 else 4,
            )
            assert np.array_equal(np.array(values), blocks), name
        # MLX computes in fp16 with the fp16 scales: within 0.05 (Q8_0 itself moves them 0.46).
        ids = mx.array([PROMPT])
        assert mx.allclose(model(ids), blockwise(original, config, kind)(ids), atol=5e-2)


def test_quantized_experts_are_the_blocks_values(tmp_path):
    """Q8_0 and Q5_0 (read through kquants) stacked experts and router as a quantizing
    converter writes them: read as quantized SwitchGLU projections computing with the blocks'
    values."""
    config = CONFIGS["qwen3_moe"]
    original = random_model(config, seed=2)
    for kind, bits in ((Q.Q8_0, 8), (Q.Q5_0, 5)):
        path = write_gguf(original, config, tmp_path / f"{kind.name}.gguf", float_type=kind)
        model, _ = load_model(hub.local_model_path(str(path)), "model")
        experts = model.model.layers[1].mlp.switch_mlp.down_proj
        assert experts.bits == bits and experts.weight.shape[0] == config["num_experts"]
        ids = mx.array([PROMPT])
        assert mx.allclose(model(ids), blockwise(original, config, kind)(ids), atol=5e-2), kind


def blockwise(model, config: dict, kind):
    """A copy of `model` whose matrices are what `kind`'s blocks hold (row by row, so llama's
    row permutation does not change them)."""
    copy = random_model(config, seed=0)

    def rounded(w):
        array = np.array(w)
        return mx.array(quants.dequantize(quants.quantize(array, kind), kind)) if w.ndim > 1 else w

    copy.update(tree_map(rounded, model.parameters()))
    return copy


def _mlx_stem(name: str) -> str:
    from macspec.models.gguf.config import mlx_name

    return mlx_name(name, "llama").removesuffix(".weight")


@pytest.mark.parametrize("kind", [Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q8_0])
def test_each_type_converts_to_mx_loads_arrays(kind, tmp_path):
    rng = np.random.default_rng(0)
    values = rng.normal(size=(8, 64)).astype(np.float32)
    writer = GGUFWriter(str(tmp_path / "t.gguf"), "llama")
    plain = {Q.F32: np.float32, Q.F16: np.float16}
    data = values.astype(plain[kind]) if kind in plain else quants.quantize(values, kind)
    writer.add_tensor("w.weight", data, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    header = read_header(tmp_path / "t.gguf")
    loaded, converted = mx.load(str(tmp_path / "t.gguf")), read_tensors(header, Layout.COMPACT)
    assert loaded.keys() == converted.keys()
    for name, array in loaded.items():
        if kind == Q.BF16:  # mx.load gives BF16 as float16; kept as the file's own bfloat16
            assert converted[name].dtype == mx.bfloat16
            assert np.array_equal(np.array(converted[name].view(mx.uint16)), data.view(np.uint16))
            array = array.astype(mx.bfloat16)
        assert converted[name].dtype == array.dtype
        assert mx.array_equal(converted[name], array), name


def test_bos_is_added_when_the_file_says_so(tmp_path, published):
    config = CONFIGS["llama"]
    path = write_gguf(random_model(config, 3), config, tmp_path / "bos.gguf", add_bos=True)
    _, tok = load_model(hub.local_model_path(str(path)), "model")
    assert tok.encode("hi") == [256, *published.encode("hi")]  # <|bos|>, then the text
    turns = [{"role": "user", "content": "hi"}]
    templated = tok.apply_chat_template(turns, add_generation_prompt=True)
    assert templated == published.apply_chat_template(turns, add_generation_prompt=True)


def test_derived_folder_is_kept_and_follows_the_file(tmp_path, monkeypatch):
    config, path = CONFIGS["llama"], tmp_path / "model.gguf"
    first = random_model(config, seed=1)
    folder = hub.local_model_path(str(write_gguf(first, config, path)))

    def no_derivation(*args):
        raise AssertionError("derived again")

    with monkeypatch.context() as patch:  # found by the file's hash: nothing derived again
        patch.setattr("macspec.models.gguf.folder.write_tokenizer", no_derivation)
        assert hub.local_model_path(str(path)) == folder
    second = random_model(config, seed=2)  # the same shapes and metadata, other weights
    changed = hub.local_model_path(str(write_gguf(second, config, path)))
    assert changed != folder
    ids = mx.array([PROMPT])
    assert mx.allclose(load_model(changed, "model")[0](ids), second(ids), atol=1e-4, rtol=1e-4)
    with pytest.raises(MacspecError, match="changed since it was read"):
        load_model(folder, "model")  # the old folder never reads the new weights


# -- bad input: one line, exit 2, nothing half-written -------------------------------------------
def _tiny_file(path, *, arch="llama", odd_tensor=None):
    """A file with a tokenizer and a tensor but no model: only for what is refused first."""
    writer = GGUFWriter(str(path), arch)
    write_tiny_tokenizer(writer)
    writer.add_tensor("token_embd.weight", np.zeros((VOCAB, 64), np.float32))
    if odd_tensor is not None:
        row_bytes = 4 * GGML_QUANT_SIZES[odd_tensor][1]  # four blocks a row
        writer.add_tensor(
            "blk.0.attn_q.weight", np.zeros((64, row_bytes), np.uint8), raw_dtype=odd_tensor
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _bad_files(root):
    root.mkdir()
    whole = _tiny_file(root / "whole.gguf")
    data = whole.read_bytes()
    (root / "cut-data.gguf").write_bytes(data[: len(data) - 1000])
    (root / "cut-header.gguf").write_bytes(data[:200])
    (root / "magic.gguf").write_bytes(b"GGML" + data[4:])
    (root / "version.gguf").write_bytes(b"GGUF" + (4).to_bytes(4, "little") + data[8:])
    (root / "folder.gguf").mkdir()
    config = CONFIGS["llama"]
    write_gguf(random_model(config, seed=0), config, root / "notok.gguf", tokenizer=False)
    write_gguf(random_model(config, seed=0), config, root / "good.gguf")  # a target for drafts
    return {
        "cut-data.gguf": "truncated",
        "cut-header.gguf": "truncated GGUF header (the file ends at byte 200; an incomplete",
        "magic.gguf": "not a GGUF file",
        "version.gguf": "GGUF version 4",
        "folder.gguf": "a folder, not a .gguf file",
        "missing.gguf": "no such file",
        str(
            _tiny_file(root / "q8_1.gguf", odd_tensor=Q.Q8_1).name  # gguf cannot dequantize it
        ): "tensor blk.0.attn_q.weight is Q8_1",
        str(
            _tiny_file(root / "mamba.gguf", arch="mamba").name
        ): "architecture 'mamba' is not supported for GGUF files (supported: llama, mistral3, "
        "qwen2, qwen3, qwen3moe, gemma2, gemma3, phi3, gpt-oss, qwen35, qwen35moe, "
        "granitehybrid, gemma3n, smollm3, granite)",
        "notok.gguf": "no tokenizer",
    }


def test_bad_files_are_one_line_and_exit_2(tmp_path, capsys):
    cases = _bad_files(tmp_path / "bad")
    for name, message in {**cases, "": "an empty model name"}.items():
        path = str(tmp_path / "bad" / name) if name else ""
        for flag in ("--model", "--draft-model"):
            args = ["run", "hi", flag, path]
            if flag == "--draft-model":  # beside a target that loads
                args += ["--model", str(tmp_path / "bad" / "good.gguf"), "--draft", "model"]
            code = main(args)
            err = capsys.readouterr().err
            assert code == 2, (name, flag, err)
            assert err.count("\n") == 1 and message in err, (name, flag, err)
    leftovers = [p.name for p in (macspec_home() / "gguf").iterdir() if p.name.startswith(".")]
    assert leftovers == []


def test_a_first_load_says_nothing_of_transformers(tmp_path):
    """Deriving the tokenizer imports transformers, whose "PyTorch was not found" advice is no
    line for macspec's users: a fresh process's stderr is the stats line alone."""
    import os
    import subprocess
    import sys

    config = CONFIGS["llama"]
    path = write_gguf(random_model(config, seed=0), config, tmp_path / "model.gguf")
    env = {**os.environ, "MACSPEC_HOME": str(tmp_path / "home")}
    env.pop("TRANSFORMERS_NO_ADVISORY_WARNINGS", None)
    command = [sys.executable, "-m", "macspec", "run", "--model", str(path), "--raw", "hi"]
    done = subprocess.run([*command, "--max-tokens", "2"], capture_output=True, text=True,
                          env=env, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "PyTorch" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
