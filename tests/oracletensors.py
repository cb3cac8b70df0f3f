"""The tensors of tests/oraclekit.py's tiny models: each checkpoint in Hugging Face's names and
layouts (numpy's RandomState: its stream is stable across numpy versions), then through what
llama.cpp's convert_hf_to_gguf.py does to that architecture's tensors; and the vision tower
Ollama writes into its Gemma 3 files."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from ggufkit import llama_permute

RESIDUAL_GAIN = 6.0
"""Of the matrices that write into the residual stream: a tied model's embedding would otherwise
outweigh its layers, and it would answer each id with that id again."""
GEMMA = ("gemma2", "gemma3")
"""Written with Gemma's four norms per layer, each stored +1 (Gemma2Model, Gemma3Model)."""
LLAMA_FAMILY = ("llama", "mistral3", "smollm3", "granite")
"""Written by LlamaModel (Mistral3Model's text model, SmolLM3Model and GraniteModel are one): Q
and K rows permuted."""
GEMMA_POST_NORM = 6.0
"""Gemma's post-norms' stored w (of 1 + w), for the same reason (Gemma scales its embedding by
sqrt(hidden))."""
SEED_FACTORS = 35
"""Of phi3_longrope_factors' values."""
VISION = dict(hidden=16, layers=1, ff=32, image=4, patch=2, heads=2)
"""The tiny SigLIP tower of the Ollama-written Gemma 3 file."""


def phi3_longrope_factors(rotated_pairs: int) -> dict[str, list[float]]:
    """LongRoPE's per-frequency divisors of a Phi-3.5-mini-like checkpoint: short ones near 1,
    long ones rising to tens (far apart, so which set a side rotates by shows in its logits)."""
    rng = np.random.RandomState(SEED_FACTORS)
    short = 1.0 + 0.5 * np.sort(rng.random_sample(rotated_pairs))
    long = 1.0 + 40.0 * np.sort(rng.random_sample(rotated_pairs))
    return {"short_factor": short.round(4).tolist(), "long_factor": long.round(4).tolist()}


def hf_weights(config: dict, arch: str, seed: int) -> Iterator[tuple[str, np.ndarray]]:
    """The checkpoint's tensors in Hugging Face's names and (out, in) layout, float32."""
    rng = np.random.RandomState(seed)
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    head_dim = config.get("head_dim", hidden // heads)
    kv_heads = config["num_key_value_heads"]

    def matrix(rows: int, cols: int, gain: float = 1.0) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * gain / np.sqrt(cols)).astype(np.float32)

    def norm(width: int, post: bool = False) -> np.ndarray:
        # Gemma stores w of (1 + w); Gemma's post-norms scale its layers' outputs up, as
        # RESIDUAL_GAIN does the others' (its embedding is multiplied by sqrt(hidden))
        centre = 1.0 if arch not in GEMMA else (GEMMA_POST_NORM if post else 0.0)
        return (centre + 0.3 * rng.standard_normal(width)).astype(np.float32)

    # rows of unit scale: tied outputs give logits spread over several units
    scaling = config.get("rope_scaling") or {}
    if "long_factor" in scaling:  # Phi3MiniModel.generate_extra_tensors, before the weights
        yield "rope_factors_long.weight", np.array(scaling["long_factor"], np.float32)
        yield "rope_factors_short.weight", np.array(scaling["short_factor"], np.float32)
    yield "model.embed_tokens.weight", matrix(config["vocab_size"], hidden, np.sqrt(hidden))
    norms = ["input_layernorm", "post_attention_layernorm"]
    if arch in GEMMA:
        norms += ["pre_feedforward_layernorm", "post_feedforward_layernorm"]
    for i in range(config["num_hidden_layers"]):
        layer = f"model.layers.{i}"
        if arch == "phi3":  # Phi-3 and Phi-4 checkpoints hold Q, K and V in one matrix
            qkv = [matrix(rows * head_dim, hidden) for rows in (heads, kv_heads, kv_heads)]
            yield f"{layer}.self_attn.qkv_proj.weight", np.concatenate(qkv)
        for name, rows in (
            () if arch == "phi3" else (("q", heads), ("k", kv_heads), ("v", kv_heads))
        ):
            yield f"{layer}.self_attn.{name}_proj.weight", matrix(rows * head_dim, hidden)
            if config.get("attention_bias"):
                bias = (0.3 * rng.standard_normal(rows * head_dim)).astype(np.float32)
                yield f"{layer}.self_attn.{name}_proj.bias", bias
        # outputs into the residual scaled up: a tied model's embedding would otherwise
        # outweigh them, and it would answer each id with that id again
        yield f"{layer}.self_attn.o_proj.weight", matrix(hidden, heads * head_dim, RESIDUAL_GAIN)
        if arch in ("qwen3", "qwen3moe", "gemma3"):
            yield f"{layer}.self_attn.q_norm.weight", norm(head_dim)
            yield f"{layer}.self_attn.k_norm.weight", norm(head_dim)
        for name in norms:
            yield f"{layer}.{name}.weight", norm(hidden, name.startswith("post_"))
        if "num_experts" in config:
            experts, ff = config["num_experts"], config["moe_intermediate_size"]
            yield f"{layer}.mlp.gate.weight", matrix(experts, hidden, 4.0)  # decided routes
            for e in range(experts):
                yield f"{layer}.mlp.experts.{e}.gate_proj.weight", matrix(ff, hidden)
                yield f"{layer}.mlp.experts.{e}.up_proj.weight", matrix(ff, hidden)
                yield f"{layer}.mlp.experts.{e}.down_proj.weight", matrix(hidden, ff, RESIDUAL_GAIN)
        elif arch == "phi3":  # and the gate and up projections in one, gate first
            ff = config["intermediate_size"]
            gate_up = [matrix(ff, hidden), matrix(ff, hidden)]
            yield f"{layer}.mlp.gate_up_proj.weight", np.concatenate(gate_up)
            yield f"{layer}.mlp.down_proj.weight", matrix(hidden, ff, RESIDUAL_GAIN)
        else:
            ff = config["intermediate_size"]
            yield f"{layer}.mlp.gate_proj.weight", matrix(ff, hidden)
            yield f"{layer}.mlp.up_proj.weight", matrix(ff, hidden)
            yield f"{layer}.mlp.down_proj.weight", matrix(hidden, ff, RESIDUAL_GAIN)
    yield "model.norm.weight", norm(hidden)
    if not config["tie_word_embeddings"]:
        yield "lm_head.weight", matrix(config["vocab_size"], hidden, 8.0)


def gpt_oss_weights(config: dict, seed: int) -> Iterator[tuple[str, np.ndarray]]:
    """A gpt-oss checkpoint in float (HF's GptOssForCausalLM names and layouts): biases on every
    projection, attention sinks, a router with a bias, experts stacked with gate and up
    interleaved column by column in one (E, hidden, 2 ff) tensor."""
    rng = np.random.RandomState(seed)
    hidden, heads, kv_heads = (
        config[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads")
    )
    head_dim, ff, experts = (
        config["head_dim"],
        config["intermediate_size"],
        config["num_local_experts"],
    )

    def values(*shape: int, gain: float = 1.0) -> np.ndarray:
        fan_in = shape[-1] if len(shape) > 1 else 1
        return (rng.standard_normal(shape) * gain / np.sqrt(fan_in)).astype(np.float32)

    yield "model.embed_tokens.weight", values(config["vocab_size"], hidden, gain=np.sqrt(hidden))
    for i in range(config["num_hidden_layers"]):
        layer = f"model.layers.{i}"
        for name, rows in (("q", heads), ("k", kv_heads), ("v", kv_heads)):
            yield f"{layer}.self_attn.{name}_proj.weight", values(rows * head_dim, hidden)
            yield f"{layer}.self_attn.{name}_proj.bias", values(rows * head_dim, gain=0.3)
        yield (
            f"{layer}.self_attn.o_proj.weight",
            values(hidden, heads * head_dim, gain=RESIDUAL_GAIN),
        )
        yield f"{layer}.self_attn.o_proj.bias", values(hidden, gain=0.3)
        yield f"{layer}.self_attn.sinks", values(heads)
        yield f"{layer}.input_layernorm.weight", 1 + values(hidden, gain=0.3)
        yield f"{layer}.post_attention_layernorm.weight", 1 + values(hidden, gain=0.3)
        yield f"{layer}.mlp.router.weight", values(experts, hidden, gain=4.0)
        yield f"{layer}.mlp.router.bias", values(experts, gain=0.3)
        gate_up = values(experts, 2 * ff, hidden).transpose(0, 2, 1)  # (E, hidden, 2 ff)
        yield f"{layer}.mlp.experts.gate_up_proj", np.ascontiguousarray(gate_up)
        yield (
            f"{layer}.mlp.experts.gate_up_proj_bias",
            values(experts, 2 * ff, gain=0.3 * np.sqrt(2 * ff)),
        )
        down = values(experts, hidden, ff, gain=RESIDUAL_GAIN).transpose(0, 2, 1)  # (E, ff, hidden)
        yield f"{layer}.mlp.experts.down_proj", np.ascontiguousarray(down)
        yield (
            f"{layer}.mlp.experts.down_proj_bias",
            values(experts, hidden, gain=0.3 * np.sqrt(hidden)),
        )
    yield "model.norm.weight", 1 + values(hidden, gain=0.3)
    yield "lm_head.weight", values(config["vocab_size"], hidden, gain=8.0)


def gpt_oss_converted(config: dict, seed: int) -> Iterator[tuple[str, np.ndarray]]:
    """GptOssModel.filter_tensors and modify_tensors on float experts: sinks named `.weight`;
    experts transposed to (E, out, in); gate and up taken apart (even and odd columns)."""
    for name, array in gpt_oss_weights(config, seed):
        if name.endswith(".sinks"):
            yield f"{name}.weight", array
        elif name.endswith("down_proj"):
            yield f"{name}.weight", np.ascontiguousarray(array.transpose(0, 2, 1))
        elif name.endswith("down_proj_bias"):
            yield name.replace("down_proj_bias", "down_proj.bias"), array
        elif name.endswith("gate_up_proj_bias"):
            yield name.replace("gate_up_proj_bias", "gate_proj.bias"), array[..., ::2].copy()
            yield name.replace("gate_up_proj_bias", "up_proj.bias"), array[..., 1::2].copy()
        elif name.endswith("gate_up_proj"):
            array = array.transpose(0, 2, 1)
            yield name.replace("gate_up_proj", "gate_proj.weight"), array[:, ::2, :].copy()
            yield name.replace("gate_up_proj", "up_proj.weight"), array[:, 1::2, :].copy()
        else:
            yield name, array


def converted(config: dict, arch: str, seed: int) -> Iterator[tuple[str, np.ndarray]]:
    """The converter's modify_tensors for `arch`: (HF name, array as the file stores it)."""
    if arch == "gpt-oss":
        yield from gpt_oss_converted(config, seed)
        return
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    experts: dict[str, np.ndarray] = {}
    for name, array in hf_weights(config, arch, seed):
        if arch in LLAMA_FAMILY and ".q_proj." in name:
            array = llama_permute(array, heads)  # LlamaModel.permute
        elif arch in LLAMA_FAMILY and ".k_proj." in name:
            array = llama_permute(array, kv_heads)
        elif arch in GEMMA and name.endswith("norm.weight"):
            array = array + np.float32(1.0)  # Gemma2Model.modify_tensors, Gemma3Model.norm_shift
        if ".mlp.experts." in name:  # Qwen2MoeModel: each projection's experts in one tensor
            experts[name] = array
            layer, count = name.split(".mlp.")[0], config["num_experts"]
            if len(experts) == 3 * count:
                for proj in ("down_proj", "gate_proj", "up_proj"):
                    stacked = [
                        experts[f"{layer}.mlp.experts.{e}.{proj}.weight"] for e in range(count)
                    ]
                    yield f"{layer}.mlp.experts.{proj}.weight", np.stack(stacked)
                experts.clear()
            continue
        yield name, array


def ollama_vision_tensors(seed: int, text_hidden: int) -> Iterator[tuple[str, np.ndarray]]:
    """A tiny SigLIP tower and projector under Ollama's names (convert_gemma3.go's
    Replacements: `vision_tower.vision_model` -> `v`, `multi_modal_projector` -> `mm`)."""
    rng = np.random.RandomState(seed + 2)
    width, ff, patch = VISION["hidden"], VISION["ff"], VISION["patch"]

    def values(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    yield "v.patch_embedding.weight", values(width, 3, patch, patch)
    yield "v.patch_embedding.bias", values(width)
    yield "v.position_embedding.weight", values((VISION["image"] // patch) ** 2, width)
    for i in range(VISION["layers"]):
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            yield f"v.blk.{i}.{name}.weight", values(width, width)
            yield f"v.blk.{i}.{name}.bias", values(width)
        for name in ("layer_norm1", "layer_norm2"):
            yield f"v.blk.{i}.{name}.weight", values(width)
            yield f"v.blk.{i}.{name}.bias", values(width)
        yield f"v.blk.{i}.mlp.fc1.weight", values(ff, width)
        yield f"v.blk.{i}.mlp.fc2.weight", values(width, ff)
    yield "v.post_layernorm.weight", values(width)
    yield "mm.mm_input_projection.weight", values(width, text_hidden)
    yield "mm.mm_soft_emb_norm.weight", values(width)
