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
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import oracle_gemma3n
import oracle_qwen35
from ggufkit import hf_tokenizer_writer
from oracle_granite import (
    GRANITE_HYBRID,
    GRANITE_HYBRID_MOE,
    GRANITE_MULTIPLIERS,
    granite_hybrid_converted,
)
from oracle_parameters import write_parameters
from oracletensors import (
    converted,
    ollama_vision_tensors,
    phi3_longrope_factors,
)
from toolkit import qwen3_files

FIXTURES = Path(__file__).parent / "fixtures" / "llamacpp"
QWEN3_VOCAB = 151_936  # Qwen3's config vocab_size: the tokenizer's 151,669 ids, padded
QWEN3_TOKENIZER_IDS = 151_669  # what Gemma3Model keeps of the embedding (vocab + added tokens)
SEED = 62


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
    mxfp4_experts: bool = False
    """The stacked experts' weights in MXFP4, as GptOssModel.repack_mxfp4 writes a published
    gpt-oss checkpoint's (ggml's blocks: an E8M0 exponent, 32 E2M1 codes); the rest F32."""


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
ARCHS["phi3-longrope"] = TinyArch(  # Phi-3.5-mini / Phi-4-mini: LongRoPE factors, 128k of 4k
    "phi3",
    dict(
        ARCHS["phi3"].config,
        max_position_embeddings=131_072,
        # 3 pairs: rope.dimension_count is 6
        rope_scaling=dict(rope_type="longrope", type="longrope", **phi3_longrope_factors(3)),
    ),
)
ARCHS["mistral3"] = TinyArch(  # Mistral Small 3.1/3.2, Devstral: LlamaModel under another name
    "mistral3", ARCHS["llama"].config
)
ARCHS["gpt-oss"] = TinyArch(  # gpt-oss-20b's shape, float experts (a bf16 checkpoint's path)
    "gpt-oss",
    dict(
        _BASE,
        num_hidden_layers=2,  # sliding, then full (llama.cpp's fixed pattern of 2)
        head_dim=16,
        intermediate_size=32,
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=4,
        rope_theta=150_000.0,
        max_position_embeddings=131_072,
        rope_scaling=dict(
            rope_type="yarn",
            factor=32.0,
            original_max_position_embeddings=4096,
            beta_fast=32.0,
            beta_slow=1.0,
        ),
        tie_word_embeddings=False,
    ),
)
ARCHS["granitehybrid"] = TinyArch(  # Granite 4.0 H: Mamba2 and attention layers (no rope)
    "granitehybrid", dict(GRANITE_HYBRID, vocab_size=QWEN3_VOCAB)
)
ARCHS["granitehybrid-moe"] = TinyArch(  # Granite 4.0 H Tiny, Small: experts and a shared one
    "granitehybrid", dict(GRANITE_HYBRID_MOE, vocab_size=QWEN3_VOCAB)
)
ARCHS["qwen35"] = TinyArch(  # Qwen3.5's shape: linear, full, linear; an MTP layer after them
    "qwen35",
    dict(
        _BASE,
        num_hidden_layers=3,
        layer_types=["linear_attention", "full_attention", "linear_attention"],
        full_attention_interval=2,
        head_dim=16,
        **oracle_qwen35.LINEAR,
        rope_parameters=oracle_qwen35.ROPE,
        mtp_num_hidden_layers=1,
        tie_word_embeddings=False,
    ),
    seed=10,  # 62's smallest top-2 gap is 0.0035, below twice this file's tolerance
)
ARCHS["qwen35moe"] = TinyArch(  # Qwen3.5-35B-A3B's shape: experts, a shared expert, no dense MLP
    "qwen35moe",
    {
        **{k: v for k, v in ARCHS["qwen35"].config.items() if k != "intermediate_size"},
        **dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32),
        "shared_expert_intermediate_size": 32,
    },
)
ARCHS["gemma2"] = TinyArch(  # Gemma 2: local, global, local, global; both logits softcapped
    "gemma2",
    dict(
        _BASE,
        num_hidden_layers=4,
        head_dim=16,
        sliding_window=4,  # shorter than the prompts: the local layers' window matters
        query_pre_attn_scalar=16,
        attn_logit_softcapping=2.0,  # scores here spread over units: the cap bends them
        final_logit_softcapping=15.0,  # logits reach tens: the cap bends them
        tie_word_embeddings=True,
    ),
)
ARCHS["smollm3"] = TinyArch(  # SmolLM3-3B's shape: tied; layer 3 a NoPE layer (every 4th)
    "smollm3",
    dict(_BASE, num_hidden_layers=4, tie_word_embeddings=True),
    seed=3,  # 62's smallest top-2 gap is 0.0031, below twice the tolerance
)
ARCHS["granite"] = TinyArch(  # dense Granite 3.x: tied, every multiplier away from its default
    "granite",
    dict(
        _BASE,
        num_hidden_layers=2,
        tie_word_embeddings=True,
        **{k: GRANITE_HYBRID[k] for k in GRANITE_MULTIPLIERS},
    ),
)
ARCHS["gemma3n"] = TinyArch("gemma3n", dict(_BASE, **oracle_gemma3n.OWN_CONFIG))
ARCHS["gemma3-ollama"] = replace(ARCHS["gemma3"], ollama_vision=True)
ARCHS["gpt-oss-mxfp4"] = replace(ARCHS["gpt-oss"], mxfp4_experts=True)
"""Each architecture's tiny Hugging Face config (the converter's input); gemma3-ollama is
gemma3's text model with Ollama's vision tower beside it (llama.cpp refuses the file: its
answer is gemma3's); gpt-oss-mxfp4 is gpt-oss with the published files' MXFP4 experts."""


def write_tiny_gguf(name: str, folder: Path, seed: int | None = None) -> Path:
    """`name`'s tiny model as `folder/<name>.gguf` (Qwen3's tokenizer files beside it)."""
    import gguf

    spec = ARCHS[name]
    seed = spec.seed if seed is None else seed
    config, arch = spec.config, spec.arch
    gemma3n = arch == "gemma3n"
    tokenizer = (oracle_gemma3n.tokenizer if gemma3n else qwen3_files)(folder / "tokenizer")
    path = folder / f"{name}.gguf"
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(name)
    if gemma3n:
        oracle_gemma3n.write_parameters(writer, config)
    else:
        write_parameters(writer, config, arch, spec.ollama_vision)
    hf_tokenizer_writer(tokenizer, config["vocab_size"], "qwen2")(writer)  # _set_vocab_gpt2
    kind = next(kind for kind, known in gguf.MODEL_ARCH_NAMES.items() if known == arch)
    blocks = config["num_hidden_layers"] + config.get("mtp_num_hidden_layers", 0)
    names = gguf.get_tensor_name_map(kind, blocks)
    qwen35 = arch in ("qwen35", "qwen35moe")
    if arch == "granitehybrid":
        tensors = granite_hybrid_converted(config, seed)
    elif qwen35:
        tensors = oracle_qwen35.converted(config, seed)
    elif gemma3n:
        tensors = oracle_gemma3n.converted(config, seed)
    else:
        tensors = converted(config, arch, seed)
    for hf_name, array in tensors:
        if qwen35:
            gguf_name = oracle_qwen35.gguf_name(names, hf_name)
        elif hf_name.startswith(("rope_factors_", "blk.")):
            gguf_name = hf_name  # generate_extra_tensors names them in gguf's own terms already
        else:
            gguf_name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if spec.mxfp4_experts and gguf_name.endswith("_exps.weight"):
            mxfp4 = gguf.GGMLQuantizationType.MXFP4
            writer.add_tensor(gguf_name, gguf.quants.quantize(array, mxfp4), raw_dtype=mxfp4)
            continue
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


def prompts_of(name: str) -> list[list[int]]:
    """The prompts llama.cpp answered for `name`'s tiny file."""
    spec = ARCHS[name]
    return oracle_gemma3n.prompts(spec.seed) if spec.arch == "gemma3n" else prompts(spec.seed)


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


def macspec_model(path: Path, home: Path):
    """The file loaded as `--model FILE.gguf` loads it (a derived folder under `home`)."""
    import os

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
    return model


def greedy_steps(model, prompt_ids: list[list[int]], steps: int) -> list:
    """The model's greedy steps on each prompt, one id fed at a time after the prompt, as
    llama.cpp does."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

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


def oracle_case(name: str, folder: Path) -> tuple:
    """(`name`'s tiny file rebuilt in `folder`, macspec's model of it, llama.cpp's recorded
    answer, its prompts)."""
    path = rebuilt(name, folder)
    recorded = fixture(name)
    prompts = [answer["prompt"] for answer in recorded["prompts"]]
    return path, macspec_model(path, folder / "home"), recorded, prompts


def macspec_steps(path: Path, home: Path, prompt_ids: list[list[int]], steps: int) -> list:
    """macspec's greedy steps on each prompt, the file loaded as `--model FILE.gguf` loads it."""
    return greedy_steps(macspec_model(path, home), prompt_ids, steps)
