"""The demo pair's export: Hugging Face layout, 4-bit with mlx-lm, and checks with mlx-lm.

Dev-only, imported by scripts/train/train_demo_pair.py.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from demo_corpus import BOS, EOS, PAD


@dataclass(frozen=True)
class ModelConfig:
    hidden_size: int  # d_model; a multiple of 64 so 4-bit group-64 quantization applies
    num_hidden_layers: int
    intermediate_size: int  # SwiGLU hidden width
    num_attention_heads: int
    num_key_value_heads: int  # < heads means grouped-query attention
    vocab_size: int = 2048
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 512  # the training context; longer is untrained

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


# ---------------------------------------------------------------- 5. export


def export_hf(params, cfg: ModelConfig, tok, tok_files: dict, path: Path) -> None:
    from safetensors.numpy import save_file

    path.mkdir(parents=True, exist_ok=True)
    weights = {k: np.asarray(v, np.float32) for k, v in params.items()}
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        **asdict(cfg),
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "tie_word_embeddings": True,
        "attention_bias": False,
        "mlp_bias": False,
        "rope_traditional": False,
        "bos_token_id": tok.token_to_id(BOS),
        "eos_token_id": tok.token_to_id(EOS),
        "pad_token_id": tok.token_to_id(PAD),
        "torch_dtype": "float32",
    }
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    write_tokenizer(tok, tok_files, path)


def write_tokenizer(tok, tok_files: dict, path: Path) -> None:
    tok.save(str(path / "tokenizer.json"))
    for name, content in tok_files.items():
        (path / name).write_text(json.dumps(content, indent=2) + "\n")


def quantize(src: Path, dst: Path, tok, tok_files: dict) -> None:
    """4-bit, group 64, with mlx-lm's own converter; keep only the model files.

    Scales and biases stay float32: MLX's CPU backend runs float16 ~80x slower (Metal does not).
    """
    from mlx_lm import convert

    shutil.rmtree(dst, ignore_errors=True)
    convert(str(src), str(dst), quantize=True, q_bits=4, q_group_size=64, dtype="float32")
    keep = {"config.json", "model.safetensors", "tokenizer.json", *tok_files}
    for f in dst.iterdir():
        if f.name not in keep:
            f.unlink()
    write_tokenizer(tok, tok_files, dst)  # ours, byte-for-byte, not a re-save by transformers


# ---------------------------------------------------------------- 6. checks with mlx-lm


def mlx_logits(model, ids: list[int]) -> np.ndarray:
    import mlx.core as mx

    out = model(mx.array([ids]))[0].astype(mx.float32)
    return np.array(out)


def dequantized_weights(path: Path) -> dict:
    """The 4-bit checkpoint's weights as the float32 arrays its quantized matmuls compute with."""
    import mlx.core as mx

    q = json.loads((path / "config.json").read_text())["quantization"]
    raw = mx.load(str(path / "model.safetensors"))
    out = {}
    for k, v in raw.items():
        if k.endswith((".scales", ".biases")):
            continue
        stem = k[: -len(".weight")]
        if stem + ".scales" in raw:
            v = mx.dequantize(
                v,
                raw[stem + ".scales"],
                raw[stem + ".biases"],
                group_size=q["group_size"],
                bits=q["bits"],
            )
        out[k] = np.array(v.astype(mx.float32))
    return out


def greedy(model, prompt: list[int], eos: int, max_tokens: int) -> list[int]:
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    out = []
    for token, _ in generate_step(mx.array(prompt), model, max_tokens=max_tokens):
        out.append(int(token))
        if out[-1] == eos:
            break
    return out


def agreement(target, draft, prompts: list[list[int]], eos: int, max_tokens: int):
    """Fraction of target-greedy positions where the draft's argmax is the target's token."""
    hits = total = 0
    for prompt in prompts:
        cont = greedy(target, prompt, eos, max_tokens)
        logits = mlx_logits(draft, prompt + cont)[len(prompt) - 1 : -1]
        hits += int((logits.argmax(-1) == np.array(cont)).sum())
        total += len(cont)
    return hits / total, total
