"""EAGLE-3 heads for the tiny targets, written in both published formats.

`constructed` builds a head from the target itself, so acceptance means something: with a
near-bigram target (tiny.near_bigram) the next token depends mostly on the current one, and the
head passes the current token's embedding through its attention (queries and keys are the
normalised embedding, sharply scaled: each pair attends to itself) to the target's own final
norm and LM head rows; `noise` makes it wrong now and then. The taps feed in through a small fc.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import tiny
from mlx.utils import tree_flatten
from mlx_lm.models import llama

from macspec.engine.core.taps import inner_model
from macspec.engine.drafters.eagle3 import Eagle3Config, Eagle3Head
from macspec.engine.drafters.mtp import embedding_and_head

DRAFT_VOCAB = 200
"""Ids the tiny heads score, out of the target's 260: those its bigram favours most (real heads
keep the target's most frequent tokens)."""


def target_config(target: nn.Module) -> dict:
    """The config.json of a tiny target (`tiny.arch_model`'s, or the llama one's). A llama is
    told by its class: tiny.CONFIGS is keyed by id, which a collected arch model's can share."""
    if isinstance(target, llama.Model):
        return tiny.llama_config(target)
    return tiny.CONFIGS[id(target)]


def layer_config(target: nn.Module) -> dict:
    """The head's decoder layer: the target's width, four full heads, llama."""
    config = target_config(target)
    hidden = config["hidden_size"]
    return dict(
        model_type="llama",
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=hidden // 4,
        num_hidden_layers=1,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        vocab_size=config["vocab_size"],
        max_position_embeddings=4096,
    )


def draft_ids(target: nn.Module) -> mx.array:
    """The target ids of the draft vocabulary, sorted (as published heads order them): the ids
    the target's near-bigram predicts after the most tokens, then the lowest others."""
    inner, (embed, head) = inner_model(target), embedding_and_head(target)
    logits = head(inner.norm(embed(mx.arange(tiny.VOCAB))))
    counts = mx.zeros((tiny.VOCAB,), mx.int32).at[mx.argmax(logits, axis=-1)].add(1)
    order = mx.argsort(-counts.astype(mx.float32) * tiny.VOCAB + mx.arange(tiny.VOCAB))
    return mx.sort(order[:DRAFT_VOCAB]).astype(mx.int32)


def head_config(target: nn.Module, taps, norm_before_residual: bool = True) -> Eagle3Config:
    config = target_config(target)
    return Eagle3Config(
        layer=layer_config(target),
        target_layers=tuple(taps),
        target_hidden_size=config["hidden_size"],
        draft_vocab_size=DRAFT_VOCAB,
        norm_before_residual=norm_before_residual,
    )


def constructed(
    target: nn.Module, taps, noise: float = 0.0, reads_hidden: float = 0.05, seed: int = 5
) -> dict[str, mx.array]:
    """Weights of a head made from the target (see the module's docstring), in our names."""
    config = head_config(target, taps)
    head = Eagle3Head(config)
    mx.random.seed(seed)
    weights = dict(tree_flatten(head.parameters()))
    hidden = config.layer["hidden_size"]
    eye, zeros = mx.eye(hidden), mx.zeros((hidden, hidden))
    prefix = "layers.0.self_attn."
    weights[prefix + "q_proj.weight"] = mx.concatenate([12.0 * eye, zeros], axis=1)
    weights[prefix + "k_proj.weight"] = mx.concatenate([eye, zeros], axis=1)
    weights[prefix + "v_proj.weight"] = mx.concatenate([eye, zeros], axis=1)
    weights[prefix + "o_proj.weight"] = eye
    weights["layers.0.mlp.down_proj.weight"] = mx.zeros_like(
        weights["layers.0.mlp.down_proj.weight"]
    )
    weights["fc.weight"] = reads_hidden * mx.random.normal(weights["fc.weight"].shape) / hidden
    # The residual is hidden_norm(g) (norm_before_residual): kept small, so that the head's own
    # output fed back at a later step does not drown the embedding it passes through.
    weights["layers.0.hidden_norm.weight"] = mx.full((hidden,), 0.05)
    weights["norm.weight"] = inner_model(target).norm.weight
    ids = draft_ids(target)
    embed, head = embedding_and_head(target)
    rows = embed.weight if head == embed.as_linear else head.weight
    weights["lm_head.weight"] = rows[ids]
    weights["d2t"] = ids - mx.arange(DRAFT_VOCAB, dtype=mx.int32)
    for key, value in weights.items():
        if value.ndim == 2 and noise:
            weights[key] = value + noise * mx.random.normal(value.shape) * value.std()
    return weights


def randomised(target: nn.Module, taps, seed: int = 9, scale: float = 0.1) -> dict:
    """`constructed` with every weight perturbed, norms too, so every path of the head matters
    (and guesses are still kept now and then, so rollbacks keep and drop pairs)."""
    weights = constructed(target, taps, noise=scale, reads_hidden=0.5, seed=seed)
    mx.random.seed(seed + 1)
    for key in [k for k in weights if k.endswith("norm.weight")]:
        weights[key] = weights[key] * (1.0 + 0.3 * mx.random.normal(weights[key].shape))
    return weights


def save_folder(
    target: nn.Module,
    folder: Path,
    weights: dict[str, mx.array],
    taps,
    form: str = "speculators",
    norm_before_residual: bool = True,
    bits: int | None = None,
    ship_embedding: bool = False,
) -> Path:
    """A head folder as Red Hat's speculators (`form='speculators'`) or the EAGLE / SpecForge
    repos (`form='eagle'`) publish it: config.json and model.safetensors, no tokenizer."""
    folder.mkdir(parents=True, exist_ok=True)
    layer = layer_config(target)
    weights = dict(weights)
    if ship_embedding:  # a speculators head may ship a copy of the target's
        weights["embed_tokens.weight"] = inner_model(target).embed_tokens.weight
    config: dict = {"draft_vocab_size": DRAFT_VOCAB, "norm_before_residual": norm_before_residual}
    if bits:
        head = Eagle3Head(head_config(target, taps, norm_before_residual))
        head.load_weights(list(weights.items()), strict=False)
        nn.quantize(head, group_size=32, bits=bits)
        weights = dict(tree_flatten(head.parameters()))
        config["quantization"] = {"group_size": 32, "bits": bits}
    if form == "speculators":
        config |= {
            "architectures": ["Eagle3Speculator"],
            "speculators_model_type": "eagle3",
            "speculators_config": {"algorithm": "eagle3", "proposal_methods": []},
            "transformer_layer_config": layer,
            "target_hidden_size": None,
            "eagle_aux_hidden_state_layer_ids": [t + 1 for t in taps],  # hidden-state ids
        }
    else:
        config |= {
            **layer,
            "architectures": ["LlamaForCausalLMEagle3"],
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(taps)},  # layer outputs
        }
        weights = {k.replace("layers.0.", "midlayer."): v for k, v in weights.items()}
    (folder / "config.json").write_text(json.dumps(config))
    mx.eval(weights)
    mx.save_safetensors(str(folder / "model.safetensors"), weights)
    return folder


def llama_target(seed: int = 0, layers: int = 4) -> nn.Module:
    """A tiny near-bigram llama with `layers` decoder layers."""
    model = tiny.random_model(seed, tiny.model_args(layers=layers), scale=3.0)
    return tiny.near_bigram(model, mix=0.005)


def qwen3_target(seed: int = 0) -> nn.Module:
    return tiny.near_bigram(tiny.arch_model("qwen3", seed, scale=3.0), mix=0.005)


def quantized(model: nn.Module) -> nn.Module:
    nn.quantize(model, group_size=32, bits=4)
    mx.eval(model.parameters())
    return model


def three_of_five_pair(taps=(0, 1, 3)) -> tuple[nn.Module, Eagle3Head]:
    """A qwen3 target over 5 ids and a sharp random EAGLE-3 head that can say 3 of them (draft
    ids 0, 1, 2 -> target ids 0, 2, 4): q is 0 at ids 1 and 3, where the target still puts
    mass. For the sampling rules' exact-distribution tests."""
    vocab = 5
    small = dict(hidden_size=32, num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    target = tiny.arch_model("qwen3", 11, scale=4.0, vocab=vocab, **small)
    layer = dict(small, intermediate_size=64, rms_norm_eps=1e-6, vocab_size=vocab)
    layer["num_hidden_layers"] = 1
    config = Eagle3Config(layer, tuple(taps), target_hidden_size=32, draft_vocab_size=3)
    mx.random.seed(12)
    head = Eagle3Head(config)
    head.update(tiny.tree_map(lambda w: w * 3.0 if w.ndim == 2 else w, head.parameters()))
    head.d2t = mx.array([0, 1, 2], mx.int32)
    return target, head
