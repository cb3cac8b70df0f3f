"""Tiny random GGUFs, one per architecture, written as llama.cpp's convert_hf_to_gguf.py writes
them with `--outtype f32` from a Hugging Face checkpoint that carries Qwen3's published
tokenizer.json (conversion/*.py: TextModel.set_gguf_parameters and each architecture's own
keys, tensor names by gguf's table, llama's Q/K row permutation, Gemma's +1 norms, Qwen's MoE
experts stacked). llama.cpp's greedy ids and top logits on these files are the fixtures in
tests/fixtures/llamacpp (scripts/capture/llamacpp_oracle.py); the tests rebuild each file from
its seed, byte for byte (the fixture holds its sha256), and nothing large is committed.

Weights come from numpy's RandomState (its stream is stable across numpy versions), in
Hugging Face's names and layouts, then go through the converter's steps. They are scaled so
that logits spread over several units: greedy choices are far from ties.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from ggufkit import hf_tokenizer_writer, llama_permute
from toolkit import qwen3_files

FIXTURES = Path(__file__).parent / "fixtures" / "llamacpp"
QWEN3_VOCAB = 151_936  # Qwen3's config vocab_size: the tokenizer's 151,669 ids, padded
QWEN3_TOKENIZER_IDS = 151_669  # what Gemma3Model keeps of the embedding (vocab + added tokens)
SEED = 62
RESIDUAL_GAIN = 6.0
LLAMA_FAMILY = ("llama", "mistral3")
"""Written by LlamaModel (Mistral3Model's text model is one): Q and K rows permuted."""
GEMMA_POST_NORM = 6.0


@dataclass(frozen=True)
class TinyArch:
    """One architecture's tiny model: its GGUF architecture and its Hugging Face config."""

    arch: str
    config: dict = field(default_factory=dict)
    seed: int = SEED
    """Of the weights and prompts: one whose greedy choices are all far from ties."""
    ollama_vision: bool = False
    """Written as Ollama's convert_gemma3.go writes Gemma 3 4B-27B: the vision tower's `v.` and
    `mm.` tensors and `gemma3.vision.*` keys in the same file, no rms epsilon or rope bases
    (Ollama's engine defaults them: 1e-6, 1e6 global, 1e4 local)."""


_BASE = dict(
    hidden_size=32,
    intermediate_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    rms_norm_eps=1e-6,
    max_position_embeddings=4096,
    rope_theta=10_000.0,
    vocab_size=QWEN3_VOCAB,
)
ARCHS: dict[str, TinyArch] = {
    "llama": TinyArch("llama", dict(_BASE, num_hidden_layers=2, tie_word_embeddings=False)),
    "qwen2": TinyArch(
        "qwen2", dict(_BASE, num_hidden_layers=2, tie_word_embeddings=True, attention_bias=True)
    ),
    "qwen3": TinyArch(
        "qwen3", dict(_BASE, num_hidden_layers=2, head_dim=16, tie_word_embeddings=False)
    ),
    "gemma3": TinyArch(
        "gemma3",
        dict(
            _BASE,
            num_hidden_layers=6,  # every 6th layer global (llama.cpp's fixed pattern)
            head_dim=16,
            sliding_window=4,  # shorter than the prompts: the local layers' window matters
            query_pre_attn_scalar=16,
            rope_theta=1_000_000.0,
            tie_word_embeddings=True,
            vocab_size=QWEN3_TOKENIZER_IDS,
        ),
        seed=5,  # 62's smallest top-2 gap is 0.011, below this file's tolerance
    ),
    "qwen3moe": TinyArch(
        "qwen3moe",
        dict(
            _BASE,
            num_hidden_layers=2,
            head_dim=16,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            norm_topk_prob=True,
            tie_word_embeddings=False,
        ),
    ),
}
ARCHS["phi3"] = TinyArch(  # Phi-4-mini's shape: GQA, partial rotary, tied, no sliding window
    "phi3",
    dict(
        _BASE,
        num_hidden_layers=2,
        partial_rotary_factor=0.75,
        original_max_position_embeddings=4096,
        tie_word_embeddings=True,
    ),
)
ARCHS["mistral3"] = TinyArch(  # Mistral Small 3.1/3.2, Devstral: LlamaModel under another name
    "mistral3", ARCHS["llama"].config
)
ARCHS["gemma3-ollama"] = replace(ARCHS["gemma3"], ollama_vision=True)
"""Each architecture's tiny Hugging Face config (the converter's input); gemma3-ollama is
gemma3's text model with Ollama's vision tower beside it (llama.cpp refuses the file: its
answer is gemma3's)."""
VISION = dict(hidden=16, layers=1, ff=32, image=4, patch=2, heads=2)


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
        centre = 1.0 if arch != "gemma3" else (GEMMA_POST_NORM if post else 0.0)
        return (centre + 0.3 * rng.standard_normal(width)).astype(np.float32)

    # rows of unit scale: tied outputs give logits spread over several units
    yield "model.embed_tokens.weight", matrix(config["vocab_size"], hidden, np.sqrt(hidden))
    norms = ["input_layernorm", "post_attention_layernorm"]
    if arch == "gemma3":
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


def converted(config: dict, arch: str, seed: int) -> Iterator[tuple[str, np.ndarray]]:
    """The converter's modify_tensors for `arch`: (HF name, array as the file stores it)."""
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    experts: dict[str, np.ndarray] = {}
    for name, array in hf_weights(config, arch, seed):
        if arch in LLAMA_FAMILY and ".q_proj." in name:
            array = llama_permute(array, heads)  # LlamaModel.permute
        elif arch in LLAMA_FAMILY and ".k_proj." in name:
            array = llama_permute(array, kv_heads)
        elif arch == "gemma3" and name.endswith("norm.weight"):
            array = array + np.float32(1.0)  # Gemma3Model.norm_shift
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


def _write_parameters(writer, config: dict, arch: str, ollama: bool = False) -> None:
    """TextModel.set_gguf_parameters, then the architecture's own keys."""
    import gguf

    if arch == "phi3":
        _write_phi3_parameters(writer, config)
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
    if "num_experts" in config:
        writer.add_expert_count(config["num_experts"])
        writer.add_expert_used_count(config["num_experts_per_tok"])
    if "head_dim" in config:
        writer.add_key_length(config["head_dim"])
        writer.add_value_length(config["head_dim"])
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    if arch in LLAMA_FAMILY:  # LlamaModel.set_gguf_parameters
        writer.add_vocab_size(config["vocab_size"])
        writer.add_rope_dimension_count(config["hidden_size"] // config["num_attention_heads"])
    if arch == "qwen3moe":  # Qwen2MoeModel.set_gguf_parameters
        writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
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


def write_tiny_gguf(name: str, folder: Path, seed: int | None = None) -> Path:
    """`name`'s tiny model as `folder/<name>.gguf` (Qwen3's tokenizer files beside it)."""
    import gguf

    spec = ARCHS[name]
    seed = spec.seed if seed is None else seed
    config, arch = spec.config, spec.arch
    tokenizer = qwen3_files(folder / "tokenizer")
    path = folder / f"{name}.gguf"
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(name)
    _write_parameters(writer, config, arch, spec.ollama_vision)
    hf_tokenizer_writer(tokenizer, config["vocab_size"], "qwen2")(writer)  # _set_vocab_gpt2
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], config["num_hidden_layers"])
    for hf_name, array in converted(config, arch, seed):
        gguf_name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        writer.add_tensor(gguf_name, array, raw_dtype=gguf.GGMLQuantizationType.F32)
    if spec.ollama_vision:
        for gguf_name, array in ollama_vision_tensors(seed, config["hidden_size"]):
            writer.add_tensor(gguf_name, array, raw_dtype=gguf.GGMLQuantizationType.F32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def prompts(seed: int = SEED) -> list[list[int]]:
    """Three prompts of ordinary token ids (below Qwen3's specials): 1, 7 and 20 ids long."""
    rng = np.random.RandomState(seed + 1)
    return [rng.randint(0, 151_643, size=n).tolist() for n in (1, 7, 20)]


def rebuilt(name: str, folder: Path) -> Path:
    """`name`'s tiny file written again into `folder`: byte for byte the one llama.cpp read."""
    path = write_tiny_gguf(name, folder)
    assert sha256(path) == fixture(name)["sha256"], f"{path}: not the file llama.cpp read"
    return path


def fixture(name: str) -> dict:
    """llama.cpp's recorded answer for `name` (scripts/capture/llamacpp_oracle.py)."""
    return json.loads((FIXTURES / f"{name}.json").read_text())


@dataclass
class Step:
    """One greedy step: the id chosen and the logits of every id."""

    id: int
    logits: np.ndarray


def macspec_steps(path: Path, home: Path, prompt_ids: list[list[int]], steps: int) -> list:
    """macspec's greedy steps on each prompt, the file loaded as `--model FILE.gguf` loads it
    (a derived folder under `home`), one id fed at a time after the prompt, as llama.cpp does."""
    import os

    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from macspec.models import hub
    from macspec.models.loader import load_model

    previous = os.environ.get("MACSPEC_HOME")
    os.environ["MACSPEC_HOME"] = str(home)
    try:
        model, _ = load_model(hub.local_model_path(str(path)), "model")
    finally:
        if previous is None:
            os.environ.pop("MACSPEC_HOME")
        else:
            os.environ["MACSPEC_HOME"] = previous
    answers = []
    for prompt in prompt_ids:
        cache, fed, answer = make_prompt_cache(model), prompt, []
        for _ in range(steps):
            logits = model(mx.array([fed]), cache=cache)[0, -1].astype(mx.float32)
            chosen = int(mx.argmax(logits).item())
            answer.append(Step(chosen, np.array(logits)))
            fed = [chosen]
        answers.append(answer)
    return answers
