"""The tiny Granite 4.0 H (granitehybrid) of tests/oraclekit.py: a GraniteMoeHybridForCausalLM
checkpoint (Hugging Face's names and layouts: Mamba2 mixers and attention layers, a dense
shared MLP as Granite-4.0-H-Micro has), then what llama.cpp's converter does to it
(conversion/granite.py's GraniteHybridModel, conversion/mamba.py's Mamba2Model): A_log stored as
A = -exp(A_log) with a trailing axis, D with one too, the conv1d's middle axis squeezed, the
gated norm grouped (n_groups, d_inner / n_groups), `dt_bias` as `ssm_dt.bias`, Q and K rows
permuted as LlamaModel does, the shared MLP's fused input split into gate and up, and a
per-layer `head_count_kv` (0 marks a Mamba layer)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from ggufkit import llama_permute
from oracletensors import RESIDUAL_GAIN

GRANITE_HYBRID = dict(
    architectures=["GraniteMoeHybridForCausalLM"],
    hidden_size=32,
    intermediate_size=64,
    shared_intermediate_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_hidden_layers=4,
    layer_types=["mamba", "attention", "mamba", "attention"],
    num_local_experts=0,
    num_experts_per_tok=0,
    mamba_n_heads=4,
    mamba_d_head=16,  # d_inner = 64 = 2 * hidden, the only expansion llama.cpp takes
    mamba_n_groups=1,
    mamba_d_state=16,
    mamba_d_conv=4,
    mamba_expand=2,
    mamba_conv_bias=True,
    mamba_proj_bias=False,
    embedding_multiplier=2.0,
    attention_multiplier=0.3,
    residual_multiplier=0.5,
    logits_scaling=0.5,
    position_embedding_type="nope",  # Granite 4.0 H: no rope (rope.scaling.finetuned false)
    rms_norm_eps=1e-5,
    max_position_embeddings=4096,
    rope_theta=10_000.0,
    tie_word_embeddings=True,
)


GRANITE_MULTIPLIERS = (
    "embedding_multiplier",
    "attention_multiplier",
    "residual_multiplier",
    "logits_scaling",
)
"""The Granite checkpoints' own config entries (attention's 0.3 against 1/sqrt(8) = 0.35)."""

GRANITE_HYBRID_MOE = dict(
    GRANITE_HYBRID,
    intermediate_size=32,  # each routed expert's; the shared expert keeps 64
    num_local_experts=4,
    num_experts_per_tok=2,
)
"""Granite 4.0 H Tiny's and Small's shape: routed experts beside a shared one in every layer."""


def write_granite_multipliers(writer, config: dict) -> None:
    """GraniteModel.set_gguf_parameters' own keys, after LlamaModel's (dense Granite 3.x's and
    Granite 4.0 H's)."""
    writer.add_attention_scale(config["attention_multiplier"])
    writer.add_embedding_scale(config["embedding_multiplier"])
    writer.add_residual_scale(config["residual_multiplier"])
    writer.add_logit_scale(config["logits_scaling"])


def write_granite_hybrid_parameters(writer, config: dict) -> None:
    """GraniteHybridModel.set_gguf_parameters: GraniteMoeModel's (TextModel's, LlamaModel's,
    the Granite multipliers), then the Mamba2 mixer's, a per-layer KV head count, no rope."""
    import gguf

    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_rope_freq_base(config["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_expert_count(config["num_local_experts"])
    writer.add_expert_used_count(config["num_experts_per_tok"])
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_vocab_size(config["vocab_size"])
    writer.add_rope_dimension_count(hidden // heads)
    write_granite_multipliers(writer, config)
    writer.add_expert_shared_feed_forward_length(config["shared_intermediate_size"])
    writer.add_ssm_conv_kernel(config["mamba_d_conv"])
    writer.add_ssm_state_size(config["mamba_d_state"])
    writer.add_ssm_group_count(config["mamba_n_groups"])
    writer.add_ssm_inner_size(config["mamba_expand"] * hidden)
    writer.add_ssm_time_step_rank(config["mamba_n_heads"])
    kv = [config["num_key_value_heads"] if t == "attention" else 0 for t in config["layer_types"]]
    writer.add_head_count_kv(kv)  # overwrites TextModel's (the converter's expected warning)
    writer.add_rope_scaling_finetuned(False)
    writer.add_context_length(2**20)


def granite_hybrid_weights(config: dict, seed: int) -> Iterator[tuple[str, np.ndarray]]:
    """The checkpoint's tensors in Hugging Face's names and layouts, float32."""
    rng = np.random.RandomState(seed)
    hidden, heads, kv_heads = (
        config[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads")
    )
    head_dim, ff = hidden // heads, config["shared_intermediate_size"]
    ssm_heads, inner = config["mamba_n_heads"], config["mamba_n_heads"] * config["mamba_d_head"]
    conv_dim = inner + 2 * config["mamba_n_groups"] * config["mamba_d_state"]

    def matrix(rows: int, cols: int, gain: float = 1.0) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * gain / np.sqrt(cols)).astype(np.float32)

    def near(centre: float, *shape: int) -> np.ndarray:
        return (centre + 0.3 * rng.standard_normal(shape)).astype(np.float32)

    yield "model.embed_tokens.weight", matrix(config["vocab_size"], hidden, np.sqrt(hidden))
    for i, kind in enumerate(config["layer_types"]):
        layer = f"model.layers.{i}"
        yield f"{layer}.input_layernorm.weight", near(1.0, hidden)
        if kind == "mamba":
            yield f"{layer}.mamba.in_proj.weight", matrix(inner + conv_dim + ssm_heads, hidden)
            conv = rng.standard_normal((conv_dim, 1, config["mamba_d_conv"])) * 0.5
            yield f"{layer}.mamba.conv1d.weight", conv.astype(np.float32)
            yield f"{layer}.mamba.conv1d.bias", near(0.0, conv_dim)
            yield f"{layer}.mamba.dt_bias", near(0.0, ssm_heads)
            a = np.log(rng.uniform(1.0, 16.0, ssm_heads))  # as Mamba2 initializes A_log
            yield f"{layer}.mamba.A_log", a.astype(np.float32)
            yield f"{layer}.mamba.D", near(1.0, ssm_heads)
            yield f"{layer}.mamba.norm.weight", near(1.0, inner)
            yield f"{layer}.mamba.out_proj.weight", matrix(hidden, inner, RESIDUAL_GAIN)
        else:
            for name, rows in (("q", heads), ("k", kv_heads), ("v", kv_heads)):
                yield f"{layer}.self_attn.{name}_proj.weight", matrix(rows * head_dim, hidden)
            o = matrix(hidden, heads * head_dim, RESIDUAL_GAIN)
            yield f"{layer}.self_attn.o_proj.weight", o
        yield f"{layer}.post_attention_layernorm.weight", near(1.0, hidden)
        if config["num_local_experts"]:
            experts, expert_ff = config["num_local_experts"], config["intermediate_size"]
            moe = f"{layer}.block_sparse_moe"
            yield f"{moe}.router.layer.weight", matrix(experts, hidden, 4.0)  # decided routes
            stacked = [matrix(2 * expert_ff, hidden) for _ in range(experts)]
            yield f"{moe}.input_linear.weight", np.stack(stacked)
            stacked = [matrix(hidden, expert_ff, RESIDUAL_GAIN) for _ in range(experts)]
            yield f"{moe}.output_linear.weight", np.stack(stacked)
        yield f"{layer}.shared_mlp.input_linear.weight", matrix(2 * ff, hidden)
        yield f"{layer}.shared_mlp.output_linear.weight", matrix(hidden, ff, RESIDUAL_GAIN)
    yield "model.norm.weight", near(1.0, hidden)


def granite_hybrid_converted(config: dict, seed: int) -> Iterator[tuple[str, np.ndarray]]:
    """GraniteHybridModel.modify_tensors: (HF name, or gguf's where the converter names it
    itself; the array as the file stores it)."""
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    groups, inner = config["mamba_n_groups"], config["mamba_n_heads"] * config["mamba_d_head"]
    for name, array in granite_hybrid_weights(config, seed):
        bid = name.split(".")[2] if name.startswith("model.layers.") else ""
        if name.endswith(".dt_bias"):  # Mamba2Model.filter_tensors
            name = name.removesuffix(".dt_bias") + ".dt_proj.bias"
        if name.endswith("conv1d.weight"):
            array = array.squeeze()
        elif name.endswith((".A_log", ".D")):
            array = array.reshape(*array.shape, 1)
        elif name.endswith("mamba.norm.weight"):
            array = array.reshape(groups, inner // groups)
        if name.endswith(".A_log"):
            array = -np.exp(array)
        if name.endswith("q_proj.weight"):  # LlamaModel.permute (undo_permute = True)
            array = llama_permute(array, heads)
        elif name.endswith("k_proj.weight"):
            array = llama_permute(array, kv_heads)
        # GraniteMoeModel: fused inputs split, gate first; the shared MLP is the FFN of a dense
        # model and the shared expert (`_shexp`) of one with experts
        shared = "_shexp" if config["num_local_experts"] else ""
        if name.endswith("input_linear.weight"):
            gate, up = np.split(array, 2, axis=-2)
            exps = "_exps" if "block_sparse_moe" in name else shared
            yield f"blk.{bid}.ffn_gate{exps}.weight", np.ascontiguousarray(gate)
            yield f"blk.{bid}.ffn_up{exps}.weight", np.ascontiguousarray(up)
            continue
        if name.endswith("shared_mlp.output_linear.weight"):
            yield f"blk.{bid}.ffn_down{shared}.weight", array
            continue
        yield name, np.ascontiguousarray(array)
