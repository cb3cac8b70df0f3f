"""Drafting a whole block at once with a DFlash drafter (z-lab, "DFlash: Block Diffusion for
Flash Speculative Decoding"), from the hidden states of a few target layers.

The drafter is a few Qwen3-style layers with no embedding or LM head of its own (the target's
are used). Its context is `hidden_norm(fc(concat of the tapped target layers' outputs))` for
each committed position; every layer projects it to keys and values, which are cached. A block
[last committed token, mask x (block_size - 1)] attends to the whole context and to itself
without a causal mask, and one pass predicts block_size - 1 guesses. The block's own keys and
values are never cached, so rejected guesses leave nothing to roll back; the context grows by
the committed positions only. Layer and weight names follow z-lab's MLX reference.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_causal_mask
from mlx_lm.models.cache import KVCache
from mlx_lm.models.qwen3 import MLP
from mlx_lm.models.rope_utils import initialize_rope

from macspec.engine.core.sampling import Draws, SamplingParams, probabilities
from macspec.engine.core.taps import Hidden, HiddenRows, HiddenSpec, inner_model
from macspec.engine.drafters.model import device_draft
from macspec.engine.drafters.mtp import embedding_and_head
from macspec.engine.drafters.protocol import Draft, Drafter
from macspec.errors import MacspecError


@dataclass(frozen=True)
class DFlashConfig:
    """A DFlash drafter's config.json, as z-lab publishes it."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    block_size: int
    """Ids per block: the last committed one, then block_size - 1 masks (the guesses)."""
    target_layer_ids: tuple[int, ...]
    """Target decoder layers whose outputs make the context, in concatenation order."""
    mask_token_id: int
    rope_scaling: dict | None = None
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    causal: bool = False
    """Block ids attend only to earlier block ids (z-lab's `is_causal`; off in its drafters)."""

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> DFlashConfig:
        dflash = config["dflash_config"]
        rope = config.get("rope_parameters") or config.get("rope_scaling")
        layer_types = set(config.get("layer_types") or ["full_attention"])
        if layer_types != {"full_attention"}:
            raise MacspecError(
                f"DFlash drafters with {sorted(layer_types - {'full_attention'})} layers are not "
                "supported yet (full-attention layers only)"
            )
        hidden, heads = config["hidden_size"], config["num_attention_heads"]
        return cls(
            hidden_size=hidden,
            num_hidden_layers=config["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=config["num_key_value_heads"],
            head_dim=config.get("head_dim") or hidden // heads,
            intermediate_size=config["intermediate_size"],
            rms_norm_eps=config["rms_norm_eps"],
            rope_theta=config.get("rope_theta", (rope or {}).get("rope_theta", 10000.0)),
            max_position_embeddings=config.get("max_position_embeddings", 32768),
            block_size=int(dflash.get("block_size", config.get("block_size", 16))),
            target_layer_ids=tuple(int(i) for i in dflash["target_layer_ids"]),
            mask_token_id=int(dflash["mask_token_id"]),
            rope_scaling=rope
            if rope and rope.get("type", rope.get("rope_type")) != "default"
            else None,
            input_embedding_scale=float(dflash.get("input_embedding_scale", 1.0)),
            output_multiplier=float(dflash.get("output_multiplier", 1.0)),
            causal=bool(config.get("is_causal") or dflash.get("causal") or False),
        )


class DFlashAttention(nn.Module):
    def __init__(self, config: DFlashConfig):
        super().__init__()
        dim, head_dim = config.hidden_size, config.head_dim
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.scale = head_dim**-0.5
        self.causal = config.causal
        self.q_proj = nn.Linear(dim, self.heads * head_dim, bias=False)
        self.k_proj = nn.Linear(dim, self.kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(dim, self.kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * head_dim, dim, bias=False)
        self.q_norm = nn.RMSNorm(head_dim, eps=config.rms_norm_eps)
        self.k_norm = nn.RMSNorm(head_dim, eps=config.rms_norm_eps)

    def _heads(self, x: mx.array, heads: int, norm: nn.Module | None) -> mx.array:
        b, n, _ = x.shape
        x = x.reshape(b, n, heads, -1)
        return (norm(x) if norm is not None else x).transpose(0, 2, 1, 3)

    def __call__(self, x: mx.array, context: mx.array, rope, cache: KVCache) -> mx.array:
        b, n, _ = x.shape
        offset, new = cache.offset, context.shape[1]
        queries = rope(self._heads(self.q_proj(x), self.heads, self.q_norm), offset=offset + new)
        block_keys = rope(
            self._heads(self.k_proj(x), self.kv_heads, self.k_norm), offset=offset + new
        )
        block_values = self._heads(self.v_proj(x), self.kv_heads, None)
        # The context's keys and values join the cache; the block's are used once.
        if new:
            keys = self._heads(self.k_proj(context), self.kv_heads, self.k_norm)
            values = self._heads(self.v_proj(context), self.kv_heads, None)
            keys, values = cache.update_and_fetch(rope(keys, offset=offset), values)
        else:  # nothing committed since the last block (the same prompt again)
            keys, values = cache.keys_and_values()
        keys = mx.concatenate([keys, block_keys], axis=2)
        values = mx.concatenate([values, block_values], axis=2)
        # Bidirectional within the block (all of the context is before it): no mask.
        mask = create_causal_mask(n, offset=keys.shape[2] - n) if self.causal else None
        out = mx.fast.scaled_dot_product_attention(
            queries, keys, values, scale=self.scale, mask=mask
        )
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(b, n, -1))


class DFlashLayer(nn.Module):
    def __init__(self, config: DFlashConfig):
        super().__init__()
        self.self_attn = DFlashAttention(config)
        self.mlp = MLP(config.hidden_size, config.intermediate_size)
        self.input_layernorm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def __call__(self, x: mx.array, context: mx.array, rope, cache: KVCache) -> mx.array:
        h = x + self.self_attn(self.input_layernorm(x), context, rope, cache)
        return h + self.mlp(self.post_attention_layernorm(h))


class DFlashModel(nn.Module):
    """The drafter's layers, named as in z-lab's weights (no embedding, no LM head)."""

    def __init__(self, config: DFlashConfig, target_hidden_size: int):
        super().__init__()
        self.config = config
        self.fc = nn.Linear(
            len(config.target_layer_ids) * target_hidden_size, config.hidden_size, bias=False
        )
        self.hidden_norm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.layers = [DFlashLayer(config) for _ in range(config.num_hidden_layers)]
        self.norm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rope = initialize_rope(
            config.head_dim,
            base=config.rope_theta,
            traditional=False,
            scaling_config=config.rope_scaling,
            max_position_embeddings=config.max_position_embeddings,
        )

    def __call__(self, block: mx.array, target_hidden: mx.array, cache: list) -> mx.array:
        """(1, B, D) block embeddings and (1, S, L*D_target) new context rows -> (1, B, D)."""
        context = self.hidden_norm(self.fc(target_hidden))
        h = block
        for layer, layer_cache in zip(self.layers, cache):
            h = layer(h, context, self.rope, layer_cache)
        return self.norm(h)


class DFlashDrafter(Drafter):
    """Guesses a block at a time from the target's tapped layers."""

    name = "dflash"

    def __init__(self, model: DFlashModel, target: nn.Module, vocab_size: int | None = None):
        self.model = model
        self.config = model.config
        self.needs = HiddenSpec(layers=self.config.target_layer_ids)
        self.embed, self.lm_head = embedding_and_head(target)
        self.embed_scale = getattr(inner_model(target), "embed_scale", 1.0)
        self.vocab_size = vocab_size
        self.cache = [KVCache() for _ in model.layers]
        self.width = model.fc.weight.shape[1] if hasattr(model.fc, "weight") else 0
        self.tokens: list[int] = []
        self.hidden = HiddenRows()
        """Concatenated tapped-layer outputs by position, from every target pass."""

    @property
    def max_guesses(self) -> int:
        return self.config.block_size - 1

    def add_hidden(self, start: int, hidden: Hidden) -> None:
        rows = [hidden.layers[i] for i in self.config.target_layer_ids]
        self.hidden.add(start, mx.concatenate(rows, axis=-1))

    def _trim(self, rows: int) -> None:
        held = self.cache[0].offset
        if held > rows:
            for layer_cache in self.cache:
                layer_cache.trim(held - rows)

    def start(self, prompt: Sequence[int]) -> None:
        shared = 0
        limit = min(len(self.tokens), len(prompt) - 1)
        while shared < limit and self.tokens[shared] == prompt[shared]:
            shared += 1
        self._trim(shared)  # context row i depends on ids 0 .. i
        self.tokens = list(prompt)

    def rollback(self, keep: int) -> None:
        self._trim(keep)
        self.hidden.forget_before(self.cache[0].offset)

    def block_logits(self, context: Sequence[int], k: int) -> tuple[mx.array, int] | None:
        """One block pass after `context`: (logits (k', V) of the next k' <= k positions, context
        rows fed), or None when there is no context to draft from."""
        n = len(context)
        self.tokens = list(context)
        lo = self.cache[0].offset
        k = min(k, self.max_guesses)
        if lo > n - 1 or (lo == 0 and n == 1) or not self.hidden.has(lo, n - 1) or k < 1:
            return None
        block = [context[-1]] + [self.config.mask_token_id] * self.max_guesses
        scale = self.embed_scale * self.config.input_embedding_scale
        x = self.embed(mx.array(block, mx.uint32))[None] * scale
        rows = self.hidden.get(lo, n - 1)[None] if lo < n - 1 else mx.zeros((1, 0, self.width))
        out = self.model(x, rows, self.cache)[0, 1 : 1 + k]
        logits = (self.lm_head(out) * self.config.output_multiplier)[:, : self.vocab_size]
        return logits, n - 1 - lo

    def propose(
        self,
        context: Sequence[int],
        k: int,
        params: SamplingParams,
        draws: Draws | None,
        confidence_floor: float | None,
    ) -> Draft:
        block = self.block_logits(context, k)
        if block is None:
            return Draft(tokens=[], source=self.name)  # no context to draft from
        logits, fed = block
        k = logits.shape[0]
        guesses = []
        for i in range(k):
            row = logits[i : i + 1]
            if params.greedy:
                guesses.append((mx.argmax(row, axis=-1), row))
            else:
                q = probabilities(row, params)
                guesses.append((draws(q, i), q))
        # One pass drafts the whole block.
        return device_draft(guesses, params, confidence_floor, 1, fed, self.name)
