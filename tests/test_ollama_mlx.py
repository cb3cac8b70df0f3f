"""Ollama's MLX models (tensor-layer manifests) read in place: the same model and the same
greedy ids as mlx-lm on the same arrays, for every quantization Ollama writes."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import pytest
from losslesskit import reference
from mlx_lm import load as mlx_load
from ollamamlxkit import write_model
from storekit import OllamaStore
from tiny import arch_config, arch_model

from macspec.models import hub
from macspec.models.loader import load_model

PROMPT = [5, 72, 101, 108, 108, 111, 32, 119]


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> OllamaStore:
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "ollama"))
    monkeypatch.setenv("MACSPEC_HOME", str(tmp_path / "home"))
    return OllamaStore(tmp_path / "ollama")


def store_files(root: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def assert_same_model(name: str, written, root: Path) -> None:
    before = store_files(root)
    folder = hub.local_model_path(name)
    model, _ = load_model(folder, "model")
    want, _ = mlx_load(str(written.reference))
    prompt = mx.array([PROMPT])
    assert mx.array_equal(model(prompt), want(prompt))
    assert reference(model, PROMPT, 12) == reference(want, PROMPT, 12)
    assert not list(folder.glob("*.safetensors"))  # the weights stay in the store's blobs
    assert store_files(root) == before  # nothing in the store written


@pytest.mark.parametrize("base", ["int4", "mxfp4", "nvfp4", "mxfp8", None])
def test_a_dense_model_equals_mlx_lm_on_the_same_arrays(store, tmp_path, base):
    model = arch_model("qwen3", 0, scale=3.0)
    config = arch_config("qwen3")
    written = write_model(store, "tiny:mlx", model, config, base, tmp_path / "ref")
    assert_same_model("tiny:mlx", written, store.root)
    assert_same_model("ollama:tiny:mlx", written, store.root)


def test_int4_promotes_what_ollamas_policy_promotes(store, tmp_path):
    model = arch_model("qwen3", 0)
    write_model(store, "tiny:int4", model, arch_config("qwen3"), "int4", tmp_path / "ref")
    loaded, _ = load_model(hub.local_model_path("tiny:int4"), "model")
    layer = loaded.model.layers[0]
    bits = {
        name: getattr(module, "bits", None)
        for name, module in [
            ("q", layer.self_attn.q_proj),
            ("k", layer.self_attn.k_proj),
            ("v", layer.self_attn.v_proj),
            ("down", layer.mlp.down_proj),
            ("up", layer.mlp.up_proj),
            ("head", loaded.lm_head),
            ("embed", loaded.model.embed_tokens),
        ]
    }
    assert bits == {"q": 4, "k": 8, "v": 8, "down": 8, "up": 4, "head": 8, "embed": None}


@pytest.mark.parametrize("per_expert", [False, True])
def test_stacked_and_per_expert_moe_equal_mlx_lm(store, tmp_path, per_expert):
    model, config = arch_model("qwen3_moe", 1, scale=3.0), arch_config("qwen3_moe")
    ref = tmp_path / "ref"
    written = write_model(store, "moe:int4", model, config, "int4", ref, per_expert=per_expert)
    assert_same_model("moe:int4", written, store.root)


def test_a_second_use_reads_the_derived_folder(store, tmp_path):
    write_model(
        store, "tiny:q", arch_model("qwen3", 0), arch_config("qwen3"), "int4", tmp_path / "r"
    )
    first = hub.local_model_path("tiny:q")
    assert (first / "tokenizer.json").is_file() and (first / "tokenizer_config.json").is_file()
    stamp = (first / "config.json").stat().st_mtime_ns
    assert hub.local_model_path("tiny:q") == first
    assert (first / "config.json").stat().st_mtime_ns == stamp


def test_a_carried_dflash_draft_drafts_losslessly(store, tmp_path, capsys):
    """x/create/draft.go's `draft.` DFlash drafter: `--draft dflash` and `--draft auto` take
    it; greedy tokens are the target alone's."""
    from dflashkit import dflash_config, save_dflash_folder
    from losslesskit import PROMPTS, done_of
    from test_hidden_drafters import run

    from macspec.engine.drafters.dflash import DFlashConfig, DFlashDrafter, DFlashModel
    from macspec.engine.generate.loop import Engine, GenerationConfig
    from macspec.engine.policy.length import FixedPolicy
    from macspec.models.drafters import load_dflash

    drafter_folder = save_dflash_folder(tmp_path / "dflash", target_layer_ids=(0, 1))
    config = dflash_config(target_layer_ids=(0, 1))
    drafter = DFlashModel(DFlashConfig.from_dict(config), 64)
    drafter.load_weights(str(drafter_folder / "model.safetensors"))
    target = arch_model("qwen3", 0, scale=3.0)
    draft = (drafter, config)
    write_model(
        store, "tiny:dflash", target, arch_config("qwen3"), "int4", tmp_path / "r", draft=draft
    )
    folder = hub.local_model_path("tiny:dflash")
    carried = load_dflash(folder / "draft", arch_config("qwen3"))
    assert carried.layers[0].self_attn.q_proj.bits == 4  # quantized as Ollama stored it
    model, tokenizer = load_model(folder, "model")
    engine = Engine(model, tokenizer, DFlashDrafter(carried, model), FixedPolicy(3))
    for text in PROMPTS[:5]:  # the target alone's tokens, with guesses proposed
        prompt = tokenizer.encode(text)
        done = done_of(engine.generate(prompt, GenerationConfig(max_tokens=16)))
        assert done.tokens == reference(model, prompt, 16) and done.stats.draft_proposed > 0

    base = ["run", "The quick brown fox", "--model", "tiny:dflash", "--json", "--max-tokens", "16"]
    plain = json.loads(run(capsys, *base, "--no-draft")[1])
    for draft_flag, name in (("dflash", "dflash"), ("auto", "auto")):
        code, out, err = run(capsys, *base, "--draft", draft_flag, "-k", "3")
        assert code == 0, err
        record = json.loads(out)
        assert record["drafter"] == name and record["tokens"] == plain["tokens"]
        assert record["stats"]["draft_proposed"] > 0


def test_modules_a_sanitize_renamed_are_quantized_as_their_arrays_say(store, tmp_path):
    """A module the derived map does not name (a VLM's sanitize renames its paths) is quantized
    as mlx-lm infers it from its arrays: mode included (mxfp4 and its mxfp8 promotions)."""
    model = arch_model("qwen3", 0, scale=3.0)
    written = write_model(store, "tiny:fp4", model, arch_config("qwen3"), "mxfp4", tmp_path / "r")
    folder = hub.local_model_path("tiny:fp4")
    config = json.loads((folder / "config.json").read_text())
    kept = {k: v for k, v in config["quantization"].items() if "layers.1." not in k}
    (folder / "config.json").write_text(json.dumps({**config, "quantization": kept}))
    assert_same_model("tiny:fp4", written, store.root)


def test_nvfp4_with_global_scales_equals_the_dequantized_float_model(store, tmp_path):
    """ModelOpt's nvfp4 (x/create/prequant.go: `X.weight.global_scale`, the dequantizing
    multiplier) computed as Ollama's runner does, the quantized product times the scale: the
    same greedy ids as mlx-lm's float model of the same weights dequantized."""
    from macspec.models.quantized import GlobalScaledLinear

    model = arch_model("qwen3", 0, scale=3.0)
    ref = tmp_path / "ref"
    written = write_model(
        store, "tiny:nvfp4", model, arch_config("qwen3"), "nvfp4", ref, global_scales=True
    )
    loaded, _ = load_model(hub.local_model_path("tiny:nvfp4"), "model")
    q_proj = loaded.model.layers[0].self_attn.q_proj
    assert isinstance(q_proj, GlobalScaledLinear) and q_proj.mode == "nvfp4"
    assert float(q_proj.global_scale) != 1.0  # the stored scale, loaded
    want, _ = mlx_load(str(written.reference))
    prompt = mx.array([PROMPT])
    assert mx.allclose(loaded(prompt), want(prompt), atol=1e-3, rtol=1e-3)
    assert reference(loaded, PROMPT, 12) == reference(want, PROMPT, 12)
    x = mx.random.normal((2, q_proj.scales.shape[-1] * 16))
    ollama = mx.quantized_matmul(
        x, q_proj.weight, q_proj.scales, transpose=True, group_size=16, bits=4, mode="nvfp4"
    )
    assert mx.array_equal(q_proj(x), ollama * q_proj.global_scale)  # x/models/nn's Forward


def test_a_global_scaled_embedding_dequantizes_its_rows_then_scales():
    from macspec.models.quantized import quantize_as_saved

    table = mx.random.normal((8, 32))
    scale = mx.array(0.05, mx.float32)
    weight, scales = mx.quantize(table / scale, group_size=16, bits=4, mode="nvfp4")
    embedding = nn.Embedding(8, 32)
    weights = {"weight": weight, "scales": scales, "global_scale": scale}
    holder = nn.Module()
    holder.embed = embedding
    named = {f"embed.{k}": v for k, v in weights.items()}
    quantize_as_saved(holder, {"group_size": 16, "bits": 4, "mode": "nvfp4"}, named)
    holder.load_weights(list(named.items()), strict=True)
    rows = mx.array([3, 1])
    floats = mx.dequantize(weight, scales, group_size=16, bits=4, mode="nvfp4") * scale
    got = holder.embed(rows)  # nvfp4 dequantizes to bfloat16, the scaled rows cast back
    assert got.dtype == mx.bfloat16 and mx.allclose(got, floats[rows], atol=1e-2)
    x = mx.random.normal((1, 32))
    assert mx.allclose(holder.embed.as_linear(x), x @ floats.T, atol=1e-4)


def test_stacked_experts_with_global_scales_are_one_line(store, tmp_path):
    """MLX's gather_qmm takes a global scale in its own convention (amax), not Ollama's
    multiplier: refused, not computed wrong."""
    from macspec.errors import MacspecError

    model, config = arch_model("qwen3_moe", 1), arch_config("qwen3_moe")
    write_model(store, "moe:nv", model, config, "nvfp4", tmp_path / "r", global_scales=True)
    with pytest.raises(MacspecError, match="switch_mlp.* nvfp4 global scale are not supported"):
        load_model(hub.local_model_path("moe:nv"), "model")
