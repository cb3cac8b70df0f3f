"""The tiny Qwen3.5 of tests/oraclekit.py: a Hugging Face Qwen3_5ForCausalLM checkpoint (Gated
DeltaNet and full attention layers, an MTP layer), its metadata and tensors written as
convert_hf_to_gguf.py's Qwen3_5TextModel writes them (conversion/qwen.py: Qwen3NextModel's keys
and modify_tensors, _LinearAttentionVReorderBase's value heads tiled, _QwenMtpMixin's MTP layer
as an extra block, _Qwen35MRopeMixin's sections)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from oracletensors import RESIDUAL_GAIN

NEXTN = {
    "eh_proj": "nextn.eh_proj",
    "enorm": "nextn.enorm",
    "hnorm": "nextn.hnorm",
    "shared_head.norm": "nextn.shared_head_norm",
}
"""gguf-py's names of the MTP layer's own tensors (llama.cpp's constants.py; the `gguf` package
installed here predates them)."""

SHAPE = (
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
)
LINEAR = dict(
    linear_num_key_heads=2,
    linear_num_value_heads=4,  # more value heads than key heads: the converter tiles them
    linear_key_head_dim=8,
    linear_value_head_dim=8,
    linear_conv_kernel_dim=4,
)
"""The tiny model's Gated DeltaNet layers (llama.cpp needs key and value heads of one width)."""
ROPE = dict(rope_type="default", rope_theta=10_000.0, partial_rotary_factor=0.5)
ROPE["mrope_section"] = [2, 1, 1]  # every rotated pair in a section (a 4th would not turn)


def write_parameters(writer, config: dict) -> None:
    """TextModel's keys, then _QwenMtpMixin's and Qwen3NextModel's, in the converter's order."""
    import gguf

    layers, mtp = config["num_hidden_layers"], config["mtp_num_hidden_layers"]
    rope = config["rope_parameters"]
    writer.add_block_count(layers + mtp)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    if "intermediate_size" in config:  # Qwen3.5 MoE's has none
        writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_rope_dimension_sections([*rope["mrope_section"], 0])
    writer.add_rope_freq_base(rope["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    if "num_experts" in config:
        writer.add_expert_count(config["num_experts"])
        writer.add_expert_used_count(config["num_experts_per_tok"])
    writer.add_key_length(config["head_dim"])
    writer.add_value_length(config["head_dim"])
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    if "num_experts" in config:  # Qwen2MoeModel.set_gguf_parameters
        writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
        writer.add_expert_shared_feed_forward_length(config["shared_expert_intermediate_size"])
    if mtp:  # _QwenMtpMixin writes the key only for a head
        writer.add_nextn_predict_layers(mtp)
    writer.add_ssm_conv_kernel(config["linear_conv_kernel_dim"])
    writer.add_ssm_state_size(config["linear_key_head_dim"])
    writer.add_ssm_group_count(config["linear_num_key_heads"])
    writer.add_ssm_time_step_rank(config["linear_num_value_heads"])
    writer.add_ssm_inner_size(config["linear_value_head_dim"] * config["linear_num_value_heads"])
    recurrent = [kind == "linear_attention" for kind in config["layer_types"]] + [False] * mtp
    writer.add_array(f"{writer.arch}.attention.recurrent_layers", recurrent)  # add_recurrent_layers
    writer.add_full_attention_interval(config["full_attention_interval"])
    writer.add_rope_dimension_count(int(config["head_dim"] * rope["partial_rotary_factor"]))


def gguf_name(names, hf_name: str) -> str:
    """The tensor's GGUF name: gguf's table, or the MTP layer's own."""
    found = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
    if found is not None:
        return found
    stem, _, kind = hf_name.rpartition(".")
    block, part = stem.removeprefix("model.layers.").split(".", 1)
    return f"blk.{block}.{NEXTN[part]}.{kind}"


def hf_weights(config: dict, seed: int) -> Iterator[tuple[str, np.ndarray]]:
    """The checkpoint's text tensors, the MTP layer's already named as _QwenMtpMixin's
    filter_tensors renames them (`mtp.layers.0` -> the block after the decoder's)."""
    rng = np.random.RandomState(seed)
    hidden, heads, kv_heads, head_dim = (config[k] for k in SHAPE)
    layers = config["num_hidden_layers"]
    k_heads, v_heads = config["linear_num_key_heads"], config["linear_num_value_heads"]
    key_dim = k_heads * config["linear_key_head_dim"]
    value_dim = v_heads * config["linear_value_head_dim"]

    def matrix(rows: int, cols: int, gain: float = 1.0) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * gain / np.sqrt(cols)).astype(np.float32)

    def values(*shape: int, centre: float = 0.0, spread: float = 0.3) -> np.ndarray:
        return (centre + spread * rng.standard_normal(shape)).astype(np.float32)

    def attention(layer: str) -> Iterator[tuple[str, np.ndarray]]:
        yield f"{layer}.self_attn.q_proj.weight", matrix(2 * heads * head_dim, hidden)
        yield f"{layer}.self_attn.k_proj.weight", matrix(kv_heads * head_dim, hidden)
        yield f"{layer}.self_attn.v_proj.weight", matrix(kv_heads * head_dim, hidden)
        yield f"{layer}.self_attn.o_proj.weight", matrix(hidden, heads * head_dim, RESIDUAL_GAIN)
        yield f"{layer}.self_attn.q_norm.weight", values(head_dim)  # w of (1 + w)
        yield f"{layer}.self_attn.k_norm.weight", values(head_dim)

    def block(layer: str, linear: bool) -> Iterator[tuple[str, np.ndarray]]:
        yield f"{layer}.input_layernorm.weight", values(hidden)
        yield f"{layer}.post_attention_layernorm.weight", values(hidden)
        if linear:
            attn = f"{layer}.linear_attn"
            yield f"{attn}.in_proj_qkv.weight", matrix(2 * key_dim + value_dim, hidden)
            yield f"{attn}.in_proj_z.weight", matrix(value_dim, hidden)
            yield f"{attn}.in_proj_b.weight", matrix(v_heads, hidden)
            yield f"{attn}.in_proj_a.weight", matrix(v_heads, hidden)
            kernel = config["linear_conv_kernel_dim"]
            yield f"{attn}.conv1d.weight", values(2 * key_dim + value_dim, 1, kernel, spread=0.5)
            yield f"{attn}.dt_bias", values(v_heads, centre=1.0)
            yield f"{attn}.A_log", np.log(rng.uniform(1.0, 8.0, v_heads)).astype(np.float32)
            yield f"{attn}.norm.weight", values(config["linear_value_head_dim"], centre=1.0)
            yield f"{attn}.out_proj.weight", matrix(hidden, value_dim, RESIDUAL_GAIN)
        else:
            yield from attention(layer)
        if "num_experts" in config:
            yield from experts(f"{layer}.mlp")
        else:
            yield from mlp(f"{layer}.mlp", config["intermediate_size"])

    def mlp(prefix: str, ff: int) -> Iterator[tuple[str, np.ndarray]]:
        yield f"{prefix}.gate_proj.weight", matrix(ff, hidden)
        yield f"{prefix}.up_proj.weight", matrix(ff, hidden)
        yield f"{prefix}.down_proj.weight", matrix(hidden, ff, RESIDUAL_GAIN)

    def experts(prefix: str) -> Iterator[tuple[str, np.ndarray]]:
        """Qwen3.5 MoE's: a router, the experts fused ([E, 2 ff, hidden] gate first, [E,
        hidden, ff]), a shared expert and its gate."""
        count, ff = config["num_experts"], config["moe_intermediate_size"]
        yield f"{prefix}.gate.weight", matrix(count, hidden, 4.0)  # decided routes
        gate_up = np.stack([matrix(2 * ff, hidden) for _ in range(count)])
        yield f"{prefix}.experts.gate_up_proj", gate_up
        down = np.stack([matrix(hidden, ff, RESIDUAL_GAIN) for _ in range(count)])
        yield f"{prefix}.experts.down_proj", down
        yield from mlp(f"{prefix}.shared_expert", config["shared_expert_intermediate_size"])
        yield f"{prefix}.shared_expert_gate.weight", matrix(1, hidden)

    yield "model.embed_tokens.weight", matrix(config["vocab_size"], hidden, np.sqrt(hidden))
    for i, kind in enumerate(config["layer_types"]):
        yield from block(f"model.layers.{i}", kind == "linear_attention")
    yield "model.norm.weight", values(hidden)
    yield "lm_head.weight", matrix(config["vocab_size"], hidden, 8.0)
    if not config["mtp_num_hidden_layers"]:  # a checkpoint without a head, or --no-mtp
        return
    mtp = f"model.layers.{layers}"
    yield from block(mtp, linear=False)
    yield f"{mtp}.eh_proj.weight", matrix(hidden, 2 * hidden)
    for name in ("enorm", "hnorm", "shared_head.norm"):
        yield f"{mtp}.{name}.weight", values(hidden)


def _tiled(array: np.ndarray, axis: int, k_heads: int, v_heads: int) -> np.ndarray:
    """_LinearAttentionVReorderBase._reorder_v_heads: grouped by key head -> tiled."""
    moved = np.moveaxis(array, axis, 0)
    size, rest = moved.shape[0], moved.shape[1:]
    heads = moved.reshape(k_heads, v_heads // k_heads, size // v_heads, *rest)
    return np.moveaxis(np.swapaxes(heads, 0, 1).reshape(size, *rest), 0, axis)


def converted(config: dict, seed: int) -> Iterator[tuple[str, np.ndarray]]:
    """_LinearAttentionVReorderBase.modify_tensors, then Qwen3NextModel.modify_tensors."""
    k_heads, v_heads = config["linear_num_key_heads"], config["linear_num_value_heads"]
    key_rows = 2 * k_heads * config["linear_key_head_dim"]
    for name, array in hf_weights(config, seed):
        if name.endswith(".experts.down_proj"):  # Qwen2MoeModel.modify_tensors
            yield f"{name}.weight", array
            continue
        if name.endswith(".experts.gate_up_proj"):
            half = array.shape[1] // 2
            yield (
                name.replace("gate_up_proj", "gate_proj.weight"),
                np.ascontiguousarray(array[:, :half]),
            )
            yield (
                name.replace("gate_up_proj", "up_proj.weight"),
                np.ascontiguousarray(array[:, half:]),
            )
            continue
        if ".linear_attn." in name:
            if ".in_proj_qkv." in name or ".conv1d." in name:
                array = array.squeeze() if ".conv1d." in name else array
                tail = _tiled(array[key_rows:], 0, k_heads, v_heads)
                array = np.concatenate([array[:key_rows], tail])
            elif ".out_proj." in name:
                array = _tiled(array, 1, k_heads, v_heads)
            elif not name.endswith(".norm.weight"):  # z, b, a, dt_bias, A_log
                array = _tiled(array, 0, k_heads, v_heads)
        if name.endswith(".A_log"):
            array = -np.exp(array)
        elif name.endswith(".dt_bias"):
            name = name.removesuffix(".dt_bias") + ".dt_proj.bias"
        elif name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
            array = array + np.float32(1.0)
        yield name, np.ascontiguousarray(array)
