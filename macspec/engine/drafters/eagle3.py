"""Drafting with an EAGLE-3 head (Li et al. 2025, "EAGLE-3: Scaling up Inference Acceleration
of Large Language Models via Training-Time Test"), from three tapped target layers.

The head is one decoder layer (a few, rarely) with its own LM head over a draft vocabulary:

    g_i = fc(concat of the tapped target layers' outputs at position i)   (3 x D_target -> D)
    x_i = layer(concat[input_layernorm(embed(t_{i+1})), hidden_norm(g_i)], residual = g_i)
    logits = lm_head(norm(x_i))    over the draft vocabulary; target id = draft id + d2t[draft id]

With `norm_before_residual` the residual is hidden_norm(g_i); with `norm_before_fc` the
concatenated taps are normalised before fc. Position i of the head's KV cache holds the pair
(t_{i+1}, g_i) and predicts t_{i+2}. Later steps of one draft feed the head's own pre-norm
output x back in place of g, skipping fc. As with the MTP head, only pairs built from the
target's hidden states stay in the head's cache: after a verify pass its guesses' entries are
trimmed, and the kept positions are fed again with the hidden states the verify pass computed.

The published formats (speculators, EAGLE / SpecForge) are read in models/eagle3.py; this
module sees only their meaning: 0-based target layers, the layer's config, the vocabularies.
Weight names follow the speculators format (and mlx-vlm's `eagle3` drafter).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import llama
from mlx_lm.models.base import create_attention_mask

from macspec.engine.core.sampling import Draws, SamplingParams, probabilities
from macspec.engine.core.taps import Hidden, HiddenSpec
from macspec.engine.drafters.mtp import PairCache, embedding_and_head


@dataclass(frozen=True)
class Eagle3Config:
    """What an EAGLE-3 head is, whatever format it was published in."""

    layer: dict[str, Any]
    """The decoder layer's config (llama fields: hidden_size, heads, rope, vocab_size = the
    target's vocabulary)."""
    target_layers: tuple[int, ...]
    """Target decoder layers (0-based) whose outputs are concatenated for fc, in order."""
    target_hidden_size: int
    draft_vocab_size: int
    """Ids the head's LM head scores; fewer than the target's when d2t maps them."""
    norm_before_residual: bool = False
    """The first layer's residual is hidden_norm(g) rather than g."""
    norm_before_fc: bool = False
    """The concatenated taps go through an RMSNorm (`input_norm`) before fc."""
    own_embedding: bool = False
    """The head embeds with its own `embed_tokens` (else with the target's)."""
    tied_head: bool = False
    """No lm_head of its own: logits come from the embedding (only with one vocabulary)."""

    @property
    def maps_vocabulary(self) -> bool:
        return self.draft_vocab_size != self.layer["vocab_size"]


class Eagle3FirstLayer(nn.Module):
    """The layer that reads [embedding ; hidden]: its q, k and v take twice the width."""

    def __init__(self, args: llama.ModelArgs, norm_before_residual: bool):
        super().__init__()
        width = 2 * args.hidden_size
        self.norm_before_residual = norm_before_residual
        self.input_layernorm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)
        self.hidden_norm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)
        self.self_attn = attention = llama.Attention(args)  # mlx-lm's, rope scaling included
        heads, kv_heads, head_dim = attention.n_heads, attention.n_kv_heads, attention.head_dim
        bias = args.attention_bias
        attention.q_proj = nn.Linear(width, heads * head_dim, bias=bias)
        attention.k_proj = nn.Linear(width, kv_heads * head_dim, bias=bias)
        attention.v_proj = nn.Linear(width, kv_heads * head_dim, bias=bias)
        self.post_attention_layernorm = nn.RMSNorm(args.hidden_size, eps=args.rms_norm_eps)
        self.mlp = llama.MLP(args)

    def __call__(self, embeds: mx.array, hidden: mx.array, mask, cache) -> mx.array:
        normed = self.hidden_norm(hidden)
        residual = normed if self.norm_before_residual else hidden
        x = mx.concatenate([self.input_layernorm(embeds), normed], axis=-1)
        h = residual + self.self_attn(x, mask=mask, cache=cache)
        return h + self.mlp(self.post_attention_layernorm(h))


class Eagle3Head(nn.Module):
    """The head's weights, named as the speculators format names them."""

    def __init__(self, config: Eagle3Config):
        super().__init__()
        self.config = config
        args = llama.ModelArgs.from_dict({**config.layer, "model_type": "llama"})
        hidden, eps = args.hidden_size, args.rms_norm_eps
        width = len(config.target_layers) * config.target_hidden_size
        if config.own_embedding:
            self.embed_tokens = nn.Embedding(args.vocab_size, hidden)
        if config.norm_before_fc:
            self.input_norm = nn.RMSNorm(width, eps=eps)
        self.fc = nn.Linear(width, hidden, bias=False)
        self.layers = [
            Eagle3FirstLayer(args, config.norm_before_residual),
            *(llama.TransformerBlock(args) for _ in range(1, args.num_hidden_layers)),
        ]
        self.norm = nn.RMSNorm(hidden, eps=eps)
        if not config.tied_head:
            self.lm_head = nn.Linear(hidden, config.draft_vocab_size, bias=False)
        if config.maps_vocabulary:
            self.d2t = mx.zeros((config.draft_vocab_size,), mx.int32)

    def fuse(self, taps: mx.array) -> mx.array:
        """(n, layers x D_target) concatenated tapped outputs -> (n, D) hidden states g."""
        if self.config.norm_before_fc:
            taps = self.input_norm(taps)
        return self.fc(taps)

    def __call__(self, embeddings: mx.array, hidden: mx.array, cache: list) -> mx.array:
        """(n, D) embeddings of t_{i+1} and hidden states -> (n, D) pre-norm outputs."""
        embeds, h = embeddings[None], hidden[None]
        for i, (layer, layer_cache) in enumerate(zip(self.layers, cache)):
            mask = create_attention_mask(h, layer_cache)
            h = layer(embeds, h, mask, layer_cache) if i == 0 else layer(h, mask, layer_cache)
        return h[0]


class Eagle3Drafter(PairCache):
    """Guesses with an EAGLE-3 head, from the target's tapped layers and its own outputs."""

    name = "eagle3"

    def __init__(self, head: Eagle3Head, target: nn.Module, vocab_size: int | None = None):
        super().__init__(len(head.layers))  # its hidden rows: the concatenated tapped outputs
        self.head = head
        self.config = config = head.config
        self.needs = HiddenSpec(layers=tuple(sorted(set(config.target_layers))))
        target_embed, _ = embedding_and_head(target)
        self.embed = head.embed_tokens if config.own_embedding else target_embed
        self.lm_head = self.embed.as_linear if config.tied_head else head.lm_head
        self.width = vocab_size or target_embed.weight.shape[0]
        """The target's logits width: a sampled guess's q is a row over it."""
        self.targets = (
            mx.arange(config.draft_vocab_size, dtype=mx.int32) + head.d2t.astype(mx.int32)
            if config.maps_vocabulary
            else None
        )
        """Target id of each draft id."""
        self.scorable = None
        """Which draft ids map inside the width the engine scores (None: all of them); when the
        engine cuts the target's logits shorter (a draft model's smaller table), the others are
        never guessed."""
        if self.targets is not None and int(self.targets.max().item()) >= self.width:
            self.scorable = self.targets < self.width

    def add_hidden(self, start: int, hidden: Hidden) -> None:
        """Receives each target pass's tapped layers (CachedModel's sink)."""
        rows = [hidden.layers[i] for i in self.config.target_layers]
        self.hidden.add(start, mx.concatenate(rows, axis=-1))

    def _read(self, rows: mx.array) -> mx.array:
        """Concatenated tapped outputs -> g, through fc (and input_norm)."""
        return self.head.fuse(rows)

    def _to_target(self, draft_ids: mx.array) -> mx.array:
        """Draft-vocabulary ids -> the target's ids (d2t applied once)."""
        return draft_ids if self.targets is None else mx.take(self.targets, draft_ids)

    def _target_logits(self, logits: mx.array) -> mx.array:
        """(1, draft V) -> (1, target V): ids the head cannot propose get -inf (q = 0 there)."""
        if self.targets is None:
            return logits
        # One spare column takes the ids past the width (their logits are -inf already).
        full = mx.full((logits.shape[0], self.width + 1), -mx.inf, dtype=logits.dtype)
        full[:, mx.minimum(self.targets, self.width)] = logits
        return full[:, : self.width]

    def _draft_logits(self, out: mx.array) -> mx.array:
        """The head's outputs -> logits over the draft vocabulary (the target's, unmapped, cut
        to the width the engine scores)."""
        logits = self.lm_head(self.head.norm(out))
        if self.targets is None:
            return logits[:, : self.width]
        return logits if self.scorable is None else mx.where(self.scorable, logits, -mx.inf)

    def step_logits(self, out: mx.array) -> mx.array:
        """The head's outputs -> logits over the target's ids (-inf where it cannot say one),
        as a tree scores its candidates."""
        return self._target_logits(self._draft_logits(out))

    def _guess(self, out: mx.array, params: SamplingParams, draws: Draws | None, i: int):
        logits = self._draft_logits(out)
        if params.greedy:
            # The argmax over the draft vocabulary, mapped: the same id as over the target's.
            return self._to_target(mx.argmax(logits, axis=-1)), logits
        row = probabilities(self._target_logits(logits), params)
        return draws(row, i), row
