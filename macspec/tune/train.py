"""What fine-tuning a draft needs besides the loop (loop.py): the settings, the draft made
trainable, the losses and batches, and the draft fused back.

LoRA (mlx-lm's LoRA layers, on a quantized draft as QLoRA) or full fine-tuning (a quantized
draft dequantized first, re-quantized after). The loss is cross-entropy on the target's tokens
with the prompt masked, plus, when `kl_weight` > 0, the KL divergence from the target's top-k
distribution.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.tuner.trainer import default_loss
from mlx_lm.tuner.utils import linear_to_lora_layers
from mlx_lm.utils import dequantize_model


@dataclass(frozen=True)
class TrainSettings:
    """How to fine-tune the draft."""

    time_budget_s: float = 600.0
    """Training stops once this long has passed (checks of the held-out loss included)."""
    max_steps: int | None = None
    """At most this many optimizer steps (batches); None: no cap."""
    eval_every: int = 10
    """Steps between checks of the held-out loss."""
    patience: int = 5
    """Training stops after this many checks in a row without a better held-out loss."""
    min_steps: int = 0
    """The held-out loss stops training only after this many steps: a draft that was trained
    already often does worse for a while at first (Adam's first steps are as large as its
    last), then better than it started."""
    warmup: int = 10
    """Steps of linear warmup of the learning rate."""
    batch_size: int = 8
    """Conversations per batch (fewer if there are fewer examples)."""
    learning_rate: float = 1e-4
    """Peak learning rate, after a short warmup; with `max_steps`, decayed by a cosine to a
    tenth over them, else kept (the held-out loss decides when to stop)."""
    lora_rank: int | None = 8
    """LoRA rank on every linear layer of every block; None: full fine-tuning."""
    lora_scale: float = 20.0
    """mlx-lm's LoRA scale (the update is scale * B A)."""
    kl_weight: float = 0.0
    """Loss = (1 - w) * cross-entropy + w * KL(target top-k || draft); 0: cross-entropy only."""
    max_seq_length: int = 2048
    """Longer conversations are truncated (mlx-lm warns)."""
    seed: int = 0
    """Seeds the batch order and the LoRA initialisation."""

    @property
    def full(self) -> bool:
        return self.lora_rank is None


FULL_FINE_TUNING_MOST = 50_000_000
"""Drafts of at most this many parameters are fine-tuned fully unless told otherwise: full
fine-tuning needed about 13 bytes more per parameter than LoRA on a 4-bit draft (12.3 to 13.5
measured from 0.9M to 58M parameters) and 1.2-1.4x its time per step, so up to here it costs at
most ~0.65 GB and moves every weight (LoRA cannot reach the embeddings a tiny draft must
learn); the 0.5B-and-up drafts of real pairs would need 6 GB more and get LoRA
(scripts/tune_method_figures.py)."""


def parameter_count(model: nn.Module) -> int:
    """The model's parameters as if unquantized: a quantized layer's packed weight counts its
    32 / bits values per word, and its scales and biases (quantization's own) not at all."""
    bits = {
        name: m.bits
        for name, m in model.named_modules()
        if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding))
    }
    total = 0
    for name, value in tree_flatten(model.parameters()):
        module, _, leaf = name.rpartition(".")
        if module not in bits:
            total += value.size
        elif leaf == "weight":
            total += value.size * 32 // bits[module]
        elif leaf not in ("scales", "biases"):
            total += value.size
    return total


@dataclass(frozen=True)
class Precision:
    """How the draft was stored, to save it so again after training: each quantized layer's
    group size, bits and mode, by path, and the weights that were float16."""

    quantized: dict[str, dict]
    float16: frozenset[str] = frozenset()


def quantized_layers(model: nn.Module) -> dict[str, dict]:
    """Each quantized layer's group size, bits and mode, by path (a GGUF's embeddings and
    layers often differ)."""
    return {
        name: {"group_size": m.group_size, "bits": m.bits, "mode": getattr(m, "mode", "affine")}
        for name, m in model.named_modules()
        if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding))
    }


def prepare(draft: nn.Module, settings: TrainSettings) -> Precision:
    """Make the draft trainable in place; return how it was stored. Full fine-tuning trains
    float16 weights in float32: Adam's steps in float16 overflow to NaN within a step or two
    (a GGUF's Q8_0 and Q4_0 layers dequantize to float16)."""
    quantized = quantized_layers(draft)
    mx.random.seed(settings.seed)
    float16: frozenset[str] = frozenset()
    if settings.full:
        dequantize_model(draft)
        weights = tree_flatten(draft.parameters())
        float16 = frozenset(name for name, w in weights if w.dtype == mx.float16)
        draft.update(
            tree_unflatten([(n, w.astype(mx.float32)) for n, w in weights if n in float16])
        )
        draft.unfreeze()
    else:
        draft.freeze()
        config = {"rank": settings.lora_rank, "scale": settings.lora_scale, "dropout": 0.0}
        linear_to_lora_layers(draft, len(draft.layers), config)
    mx.eval(draft.parameters())
    return Precision(quantized, float16)


def trainable_parameters(model: nn.Module) -> int:
    return sum(v.size for _, v in tree_flatten(model.trainable_parameters()))


def answer_loss(model, batch, lengths):
    """Cross-entropy on the answer's tokens: mlx-lm's default_loss, given each row's length
    less one, because its mask reaches one position past the row's end and would train the
    draft to predict the padding id after every answer (ml-explore/mlx-lm PR #1697)."""
    return default_loss(model, batch, lengths - mx.array([0, 1]))


def answer_mask(targets: mx.array, lengths: mx.array) -> mx.array:
    """Which predictions count: of tokens[offset:length] (targets[t - 1] is tokens[t])."""
    steps = mx.arange(1, targets.shape[1] + 1)
    return mx.logical_and(steps >= lengths[:, 0:1], steps < lengths[:, 1:])


def distill_loss(weight: float):
    """(1 - weight) * cross-entropy on the target's tokens + weight * KL(target || draft) over
    the target's top-k ids (the draft's log-probabilities over its whole vocabulary)."""

    def loss(model, batch, lengths, top_ids, top_logprobs):
        logits = model(batch[:, :-1]).astype(mx.float32)
        targets = batch[:, 1:]
        mask = answer_mask(targets, lengths)
        ntoks = mask.sum()
        ce = (nn.losses.cross_entropy(logits, targets) * mask).sum() / ntoks
        draft_logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        q = mx.take_along_axis(draft_logprobs, top_ids, axis=-1)
        kl = (mx.exp(top_logprobs) * (top_logprobs - q)).sum(axis=-1)
        kl = (kl * mask).sum() / ntoks
        return (1 - weight) * ce + weight * kl, ntoks

    return loss


def iterate_distill_batches(dataset, batch_size, max_seq_length, loop=False, seed=None, **_):
    """mlx-lm's iterate_batches for examples that carry the target's top-k: batches of similar
    lengths in a random order, padded; the top-k rows aligned with the predicted positions."""
    order = sorted(range(len(dataset)), key=lambda i: len(dataset[i].tokens))
    groups = [order[i : i + batch_size] for i in range(0, len(order) - batch_size + 1, batch_size)]
    if seed is not None:
        np.random.seed(seed)
    top_k = dataset[0].top_ids.shape[-1]
    while True:
        for g in np.random.permutation(len(groups)):
            chosen = [dataset[j] for j in groups[g]]
            width = min(max_seq_length, 1 + 32 * ((max(len(e.tokens) for e in chosen) + 31) // 32))
            tokens = np.zeros((len(chosen), width), np.int32)
            top_ids = np.zeros((len(chosen), width - 1, top_k), np.int32)
            top_logprobs = np.full((len(chosen), width - 1, top_k), -1e9, np.float32)
            lengths = []
            for row, e in enumerate(chosen):
                n = min(len(e.tokens), width)
                tokens[row, :n] = e.tokens[:n]
                # Prediction t (of tokens[t + 1]) uses the target's row t - (offset - 1).
                answer = max(0, min(e.answer_length, n - e.offset))
                span = slice(e.offset - 1, e.offset - 1 + answer)
                top_ids[row, span] = np.array(e.top_ids[:answer])
                top_logprobs[row, span] = np.array(e.top_logprobs[:answer])
                lengths.append((e.offset, n))
            yield (
                mx.array(tokens),
                mx.array(lengths),
                mx.array(top_ids),
                mx.array(top_logprobs),
            )
        if not loop:
            break


def fuse(draft: nn.Module, precision: Precision) -> nn.Module:
    """The trained draft as a plain model again: LoRA adapters fused into their layers, the
    float16 weights float16 again, and the layers that were quantized quantized again with
    their own group size, bits and mode."""
    fused = [(name, m.fuse()) for name, m in draft.named_modules() if hasattr(m, "fuse")]
    if fused:
        draft.update_modules(tree_unflatten(fused))  # LoRA on a quantized layer: re-quantized
    if precision.float16:
        weights = tree_flatten(draft.parameters())
        back = [(n, w.astype(mx.float16)) for n, w in weights if n in precision.float16]
        draft.update(tree_unflatten(back))
    quantized = precision.quantized
    for params in {tuple(sorted(p.items())) for p in quantized.values()}:
        settings = dict(params)
        nn.quantize(
            draft,
            group_size=settings["group_size"],
            bits=settings["bits"],
            mode=settings["mode"],
            class_predicate=lambda path, m, p=params: (
                path in quantized
                and tuple(sorted(quantized[path].items())) == p
                and isinstance(m, (nn.Linear, nn.Embedding))
            ),
        )
    draft.eval()
    mx.eval(draft.parameters())
    return draft
