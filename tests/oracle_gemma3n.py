"""The tiny gemma3n of tests/oraclekit.py, written as convert_hf_to_gguf.py's Gemma3NModel writes
a Gemma3nForCausalLM checkpoint with `--outtype f32`.

llama.cpp fixes widths no key tells it (models.h, llama-hparams.h): per-layer inputs of 256,
LAuReL rank 64, four AltUp streams; the first 20 layers hold keys and values. So the tiny model
has 25 layers (20-23 reuse layer 18's sliding-window cache, 24 layer 19's global one) and those
widths, and, to stay small, a 1,024-id vocabulary cut from Qwen3's tokenizer (its ids under 1,024
and the merges among them): the per-layer embedding is vocabulary x 25 x 256.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from toolkit import write_qwen3_tokenizer

VOCAB = 1024
PER_LAYER_VOCAB = VOCAB - 64
"""Of the checkpoint's per-layer embedding: the converter pads it to VOCAB with zero rows (as
Gemma 3n's 262,144 to 262,400), which llama.cpp looks the last 64 ids up in."""
LAYERS = 25
OWN_CONFIG = dict(
    head_dim=16,
    rope_theta=1_000_000.0,
    rope_local_base_freq=10_000.0,
    vocab_size=VOCAB,
    vocab_size_per_layer_input=PER_LAYER_VOCAB,
    num_hidden_layers=LAYERS,
    layer_types=["full_attention" if (i + 1) % 5 == 0 else "sliding_attention" for i in range(25)],
    sliding_window=4,  # shorter than the prompts: the local layers' window matters
    num_kv_shared_layers=LAYERS - 20,
    activation_sparsity_pattern=[0.95] * 10 + [0.0] * (LAYERS - 10),
    hidden_size_per_layer_input=256,
    laurel_rank=64,
    altup_num_inputs=4,
    altup_active_idx=0,
    final_logit_softcapping=30.0,
    tie_word_embeddings=True,
)
"""Over tests/oraclekit.py's common widths (hidden 32, 4 heads, 2 key-value heads, 64 wide)."""
STD_MULTIPLIERS = {0.95: 1.6448533535003662, 0.0: float("-inf")}
"""torch's Normal(0, 1).icdf of each sparsity, as the converter writes them."""


def tokenizer(folder: Path) -> Path:
    """Qwen3's tokenizer.json cut to its first VOCAB ids (no added tokens, no specials)."""
    write_qwen3_tokenizer(folder)
    published = json.loads((folder / "tokenizer.json").read_text())
    model = published["model"]
    vocab = {text: i for text, i in model["vocab"].items() if i < VOCAB}
    merges = []
    for merge in model["merges"]:
        left, right = merge.split(" ") if isinstance(merge, str) else merge
        if left in vocab and right in vocab and left + right in vocab:
            merges.append(merge)
    published.update(added_tokens=[], post_processor=None)
    published["model"] = {**model, "vocab": vocab, "merges": merges}
    (folder / "tokenizer.json").write_text(json.dumps(published))
    (folder / "tokenizer_config.json").write_text(json.dumps({"add_bos_token": False}))
    (folder / "config.json").write_text("{}")
    return folder


def write_parameters(writer, config: dict) -> None:
    """TextModel's, Gemma3Model's and Gemma3NModel's set_gguf_parameters (last value of each)."""
    import gguf

    for add, key in (
        (writer.add_block_count, "num_hidden_layers"),
        (writer.add_context_length, "max_position_embeddings"),
        (writer.add_embedding_length, "hidden_size"),
        (writer.add_feed_forward_length, "intermediate_size"),
        (writer.add_head_count, "num_attention_heads"),
        (writer.add_head_count_kv, "num_key_value_heads"),
        (writer.add_rope_freq_base, "rope_theta"),
        (writer.add_rope_freq_base_swa, "rope_local_base_freq"),
        (writer.add_layer_norm_rms_eps, "rms_norm_eps"),
        (writer.add_file_type, None),
        (writer.add_key_length, "head_dim"),
        (writer.add_value_length, "head_dim"),
        (writer.add_final_logit_softcapping, "final_logit_softcapping"),
        (writer.add_sliding_window, "sliding_window"),
        (writer.add_altup_active_idx, "altup_active_idx"),
        (writer.add_altup_num_inputs, "altup_num_inputs"),
        (writer.add_embedding_length_per_layer_input, "hidden_size_per_layer_input"),
        (writer.add_shared_kv_layers, "num_kv_shared_layers"),
    ):
        add(gguf.LlamaFileType.ALL_F32 if key is None else config[key])
    scales = [STD_MULTIPLIERS[s] for s in config["activation_sparsity_pattern"]]
    writer.add_activation_sparsity_scale(scales)
    writer.add_sliding_window_pattern([t == "sliding_attention" for t in config["layer_types"]])


def hf_weights(config: dict, seed: int) -> Iterator[tuple[str, np.ndarray]]:
    """A Gemma3nForCausalLM checkpoint's tensors (Hugging Face's names and (out, in) layout)."""
    rng = np.random.RandomState(seed)
    hidden, heads, kv_heads = (
        config[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads")
    )
    head_dim, ff, layers = config["head_dim"], config["intermediate_size"], LAYERS
    per_layer, rank, streams = (
        config[k] for k in ("hidden_size_per_layer_input", "laurel_rank", "altup_num_inputs")
    )

    def matrix(rows: int, cols: int, gain: float = 1.0) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * gain / np.sqrt(cols)).astype(np.float32)

    def norm(width: int, centre: float = 1.0) -> np.ndarray:
        return (centre + 0.3 * rng.standard_normal(width)).astype(np.float32)

    yield "model.embed_tokens.weight", matrix(VOCAB, hidden, np.sqrt(hidden))
    yield "model.embed_tokens_per_layer.weight", matrix(PER_LAYER_VOCAB, layers * per_layer)
    yield "model.per_layer_model_projection.weight", matrix(layers * per_layer, hidden)
    yield "model.per_layer_projection_norm.weight", norm(per_layer)
    for name in ("altup_projections", "altup_unembed_projections"):
        for i in range(streams - 1):
            yield f"model.{name}.{i}.weight", matrix(hidden, hidden)
    for i in range(layers):
        layer = f"model.layers.{i}"
        for name, rows in (("q", heads), ("k", kv_heads), ("v", kv_heads)):
            yield f"{layer}.self_attn.{name}_proj.weight", matrix(rows * head_dim, hidden)
        yield f"{layer}.self_attn.o_proj.weight", matrix(hidden, heads * head_dim)
        yield f"{layer}.self_attn.q_norm.weight", norm(head_dim)
        yield f"{layer}.self_attn.k_norm.weight", norm(head_dim)
        for name in ("input_layernorm", "post_attention_layernorm"):
            yield f"{layer}.{name}.weight", norm(hidden)
        for name in ("pre_feedforward_layernorm", "post_feedforward_layernorm"):
            yield f"{layer}.{name}.weight", norm(hidden)
        yield f"{layer}.mlp.gate_proj.weight", matrix(ff, hidden)
        yield f"{layer}.mlp.up_proj.weight", matrix(ff, hidden)
        yield f"{layer}.mlp.down_proj.weight", matrix(hidden, ff)
        yield f"{layer}.altup.correct_output_scale", norm(hidden)
        yield f"{layer}.altup.correction_coefs.weight", matrix(streams, streams, 0.5)
        yield f"{layer}.altup.prediction_coefs.weight", matrix(streams * streams, streams, 0.5)
        yield f"{layer}.altup.modality_router.weight", matrix(streams, hidden, 4.0)
        yield f"{layer}.altup.router_norm.weight", norm(hidden)
        yield f"{layer}.laurel.linear_left.weight", matrix(rank, hidden)
        yield f"{layer}.laurel.linear_right.weight", matrix(hidden, rank)
        yield f"{layer}.laurel.post_laurel_norm.weight", norm(hidden)
        yield f"{layer}.per_layer_input_gate.weight", matrix(per_layer, hidden)
        yield f"{layer}.per_layer_projection.weight", matrix(hidden, per_layer)
        yield f"{layer}.post_per_layer_input_norm.weight", norm(hidden)
    yield "model.norm.weight", norm(hidden)


def converted(config: dict, seed: int) -> Iterator[tuple[str, np.ndarray]]:
    """Gemma3NModel.filter_tensors and modify_tensors: `_scale` tensors named `.weight`; the
    per-layer embedding padded to the vocabulary with zero rows; each set of three AltUp
    projections stacked into one tensor; norms as they are."""
    stacked: dict[str, list[np.ndarray]] = {}
    for name, array in hf_weights(config, seed):
        if name.endswith("_scale"):
            name += ".weight"
        if "embed_tokens_per_layer" in name:
            padding = np.zeros((VOCAB - array.shape[0], array.shape[1]), np.float32)
            array = np.concatenate([array, padding])
        if "altup_projections" in name or "altup_unembed_projections" in name:
            group = name.split(".")[1]
            stacked.setdefault(group, []).append(array)
            if len(stacked[group]) == config["altup_num_inputs"] - 1:
                yield f"model.{group}.weight", np.stack(stacked[group])
            continue
        yield name, array


def prompts(seed: int) -> list[list[int]]:
    """Three prompts of the cut vocabulary's ids, 1, 7 and 20 long; the long one ends in an id
    past the per-layer embedding's own rows (a zero row of the padding)."""
    rng = np.random.RandomState(seed + 1)
    ids = [rng.randint(0, PER_LAYER_VOCAB, size=n).tolist() for n in (1, 7, 20)]
    ids[2][-1] = VOCAB - 1
    return ids
