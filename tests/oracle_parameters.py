"""The GGUF metadata llama.cpp's converter writes for each tiny oracle architecture
(TextModel.set_gguf_parameters and each architecture's own keys)."""

from __future__ import annotations

import math

import oracle_qwen35
from oracle_granite import write_granite_hybrid_parameters, write_granite_multipliers
from oracletensors import LLAMA_FAMILY, VISION


def write_parameters(writer, config: dict, arch: str, ollama: bool = False) -> None:
    """TextModel.set_gguf_parameters, then the architecture's own keys."""
    import gguf

    if arch == "phi3":
        _write_phi3_parameters(writer, config)
        return
    if arch == "granitehybrid":
        write_granite_hybrid_parameters(writer, config)
        return
    if arch in ("qwen35", "qwen35moe"):
        oracle_qwen35.write_parameters(writer, config)
        return
    if arch == "gemma2":
        _write_gemma2_parameters(writer, config)
        return
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    if not ollama:  # Ollama's multimodal Gemma 3 leaves these to its engine's defaults
        writer.add_rope_freq_base(config["rope_theta"])
        writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    scaling = config.get("rope_scaling")
    if scaling:  # yarn's keys, as TextModel writes them
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(scaling["factor"])
        writer.add_rope_scaling_orig_ctx_len(scaling["original_max_position_embeddings"])
        writer.add_rope_scaling_yarn_beta_fast(scaling["beta_fast"])
        writer.add_rope_scaling_yarn_beta_slow(scaling["beta_slow"])
    experts = config.get("num_experts", config.get("num_local_experts"))
    if experts:
        writer.add_expert_count(experts)
        writer.add_expert_used_count(config["num_experts_per_tok"])
    if "head_dim" in config:
        writer.add_key_length(config["head_dim"])
        writer.add_value_length(config["head_dim"])
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    if arch in LLAMA_FAMILY:  # LlamaModel.set_gguf_parameters
        writer.add_vocab_size(config["vocab_size"])
        writer.add_rope_dimension_count(config["hidden_size"] // config["num_attention_heads"])
    if arch == "granite":
        write_granite_multipliers(writer, config)
    if arch == "qwen3moe":  # Qwen2MoeModel.set_gguf_parameters
        writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
    if arch == "gpt-oss":  # GptOssModel.set_gguf_parameters
        writer.add_sliding_window(config["sliding_window"])
        writer.add_expert_feed_forward_length(config["intermediate_size"])
    if arch == "gemma3":  # Gemma3Model.set_gguf_parameters writes these again, as here
        writer.add_sliding_window(config["sliding_window"])
    if ollama:  # convert_gemma3.go, Gemma3ForConditionalGeneration
        for key in ("block_count", "embedding_length", "feed_forward_length"):
            value = VISION[{"block_count": "layers", "embedding_length": "hidden"}.get(key, "ff")]
            writer.add_uint32(f"gemma3.vision.{key}", value)
        writer.add_uint32("gemma3.vision.image_size", VISION["image"])
        writer.add_uint32("gemma3.vision.patch_size", VISION["patch"])
        writer.add_uint32("gemma3.vision.num_channels", 3)
        writer.add_uint32("gemma3.vision.attention.head_count", VISION["heads"])
        writer.add_float32("gemma3.vision.attention.layer_norm_epsilon", 1e-6)
        writer.add_uint32("gemma3.mm.tokens_per_image", 4)


def _write_phi3_parameters(writer, config: dict) -> None:
    """Phi3MiniModel.set_gguf_parameters (all its own; sliding window 0 marks Phi-4)."""
    import gguf

    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_rope_scaling_orig_ctx_len(config["original_max_position_embeddings"])
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_dimension_count(int(config["partial_rotary_factor"] * hidden) // heads)
    writer.add_rope_freq_base(config["rope_theta"])
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_sliding_window(0)
    scaling = config.get("rope_scaling")
    if scaling:  # Phi3MiniModel.generate_extra_tensors: LongRoPE's attention factor
        scale = config["max_position_embeddings"] / config["original_max_position_embeddings"]
        orig = config["original_max_position_embeddings"]
        writer.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(orig)))


def _write_gemma2_parameters(writer, config: dict) -> None:
    """Gemma2Model.set_gguf_parameters (all its own: no rope base, no query scale)."""
    import gguf

    for add, name in (
        ("context_length", "max_position_embeddings"),
        ("embedding_length", "hidden_size"),
        ("block_count", "num_hidden_layers"),
        ("feed_forward_length", "intermediate_size"),
        ("head_count", "num_attention_heads"),
        ("head_count_kv", "num_key_value_heads"),
        ("layer_norm_rms_eps", "rms_norm_eps"),
        ("key_length", "head_dim"),
        ("value_length", "head_dim"),
        ("file_type", None),
        ("attn_logit_softcapping", "attn_logit_softcapping"),
        ("final_logit_softcapping", "final_logit_softcapping"),
        ("sliding_window", "sliding_window"),
    ):
        value = gguf.LlamaFileType.ALL_F32 if name is None else config[name]
        getattr(writer, f"add_{add}")(value)
