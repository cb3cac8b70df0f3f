"""Drafting with a native multi-token-prediction (MTP) head: Qwen3.5 and Qwen3.6.

The head is one extra full-attention decoder layer that reads the target's last hidden state
and the next token's embedding and predicts the token after it (mlx-vlm's `qwen3_5_mtp` format,
as MTPLX and vLLM run it):

    h' = norm(layers(fc(concat[pre_fc_norm_embedding(embed(t_{i+1})), pre_fc_norm_hidden(h_i)])))

with the target's own embedding and LM head. Position i of the head's KV cache holds the pair
(t_{i+1}, h_i) and predicts t_{i+2}. For k > 1 the head feeds its own output back in as h.

Only pairs built from the target's own hidden states stay in the head's cache: after a verify
pass its guesses' entries are trimmed, and the kept positions are fed again, with the hidden
states the verify pass computed for them, as the first part of the next draft.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import qwen3_5
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import KVCache

from macspec.engine.core.sampling import Draws, SamplingParams, probabilities
from macspec.engine.core.taps import Hidden, HiddenRows, HiddenSpec, inner_model
from macspec.engine.drafters.model import device_draft
from macspec.engine.drafters.protocol import Draft, Drafter

MTP_TARGETS = ("qwen3_5", "qwen3_5_moe")
"""Target architectures a qwen3_5_mtp head drafts for."""


def _decoder_layer(text_config: dict) -> tuple[nn.Module, object]:
    """A full-attention decoder layer of the target's own kind, from mlx-lm's classes."""
    kind = str(text_config.get("model_type", "qwen3_5"))
    if kind.startswith("qwen3_5"):  # dense or MoE, as text_config says
        args = qwen3_5.TextModelArgs.from_dict(text_config)
        return qwen3_5.DecoderLayer(args, args.full_attention_interval - 1), args
    module = importlib.import_module(f"mlx_lm.models.{kind}")
    args = module.ModelArgs.from_dict(text_config)
    return module.TransformerBlock(args), args


class MTPHead(nn.Module):
    """The head's layers, named as in mlx-vlm's `qwen3_5_mtp` weights. For other targets (the
    demo's Llama) the layer is that architecture's own decoder block."""

    def __init__(self, text_config: dict, num_layers: int = 1):
        super().__init__()
        pairs = [_decoder_layer(text_config) for _ in range(num_layers)]
        args = pairs[0][1]
        hidden, eps = args.hidden_size, args.rms_norm_eps
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        self.pre_fc_norm_embedding = nn.RMSNorm(hidden, eps=eps)
        self.pre_fc_norm_hidden = nn.RMSNorm(hidden, eps=eps)
        self.layers = [layer for layer, _ in pairs]
        self.norm = nn.RMSNorm(hidden, eps=eps)

    def __call__(self, embeddings: mx.array, hidden: mx.array, cache: list) -> mx.array:
        """(n, D) embeddings of t_{i+1} and hidden states h_i -> (n, D) post-norm outputs."""
        x = mx.concatenate(
            [self.pre_fc_norm_embedding(embeddings), self.pre_fc_norm_hidden(hidden)], axis=-1
        )
        h = self.fc(x)[None]
        for layer, layer_cache in zip(self.layers, cache):
            h = layer(h, mask=create_attention_mask(h, layer_cache), cache=layer_cache)
        return self.norm(h)[0]


def embedding_and_head(model: nn.Module) -> tuple[nn.Module, object]:
    """The target's token embedding and its LM head (the tied embedding when there is none)."""
    embed = inner_model(model).embed_tokens
    for owner in (model, getattr(model, "language_model", None)):
        head = getattr(owner, "lm_head", None) if owner is not None else None
        if head is not None:
            return embed, head
    return embed, embed.as_linear


class PairCache(Drafter):
    """A head's KV cache of pairs (t_{i+1}, h_i) and its rollback, shared by the MTP and the
    EAGLE-3 drafters: only pairs built from the target's hidden states stay (positions < exact);
    those built from the head's own outputs go after each verify pass."""

    def __init__(self, layers: int):
        self.cache = [KVCache() for _ in range(layers)]
        self.tokens: list[int] = []
        """The sequence the head's cache was built from (its pair i used tokens[i + 1])."""
        self.exact = 0
        """Pairs in the head's cache built from the target's hidden states: positions < exact."""
        self.base = 0
        """The position of the head cache's first pair: its context starts there when the
        target's hidden states before it were never handed over (a prefix the target reused
        from its cache, for an earlier conversation's pairs)."""
        self.hidden = HiddenRows()
        """The target's hidden states by position (as the head reads them), from every pass."""

    @property
    def position(self) -> int:
        """The position the head cache's next pair would take."""
        return self.base + self.cache[0].offset

    def _trim(self, pairs: int) -> None:
        held = self.cache[0].offset
        keep = max(0, pairs - self.base)
        if held > keep:
            for layer_cache in self.cache:
                layer_cache.trim(held - keep)
        if keep == 0:
            self.base = min(self.base, pairs)
        self.exact = min(self.exact, pairs)

    def start(self, prompt: Sequence[int]) -> None:
        shared = 0
        limit = min(len(self.tokens), len(prompt))
        while shared < limit and self.tokens[shared] == prompt[shared]:
            shared += 1
        self._trim(max(0, shared - 1))  # pair i needs tokens 0 .. i + 1 unchanged
        self.tokens = list(prompt)

    def rollback(self, keep: int) -> None:
        # Entries built from the head's own outputs go; the kept positions are fed again
        # with the target's hidden states by the next propose.
        self._trim(min(self.exact, keep))
        self.hidden.forget_before(self.exact)

    def _read(self, rows: mx.array) -> mx.array:
        """The target's hidden-state rows as the head reads them (an MTP head: as they are)."""
        return rows

    def catch_up(self, context: Sequence[int]) -> tuple[mx.array, int] | None:
        """Feed the head the pairs (t_{i+1}, h_i) of every committed position not in its cache
        yet (`self.head`, `self.embed`: the subclass's): (its output that predicts the next id,
        ids fed), or None when there is nothing to draft from (a tree grows from it too)."""
        n = len(context)
        self.tokens = list(context)
        lo = self.exact
        if lo > n - 2:
            return None
        if not self.hidden.has(lo, n - 1):
            # The target reused a cached prefix whose hidden states this head never got: its
            # context starts again where the target's hidden states do (rope is relative, so
            # the pairs it keeps read as they would from further back).
            lo = self.hidden.covered_from(n - 1)
            if lo is None or lo > n - 2:
                return None
            self._trim(0)
            self.base = self.exact = lo
        ids = mx.array(list(context[lo + 1 : n]), mx.uint32)
        out = self.head(self.embed(ids), self._read(self.hidden.get(lo, n - 1)), self.cache)
        self.exact = n - 1
        return out[-1:], n - 1 - lo

    def _feedback(self, out: mx.array) -> mx.array:
        """The hidden state a later step reads: the head's own output (an MTP head's after its
        norm, an EAGLE-3 head's before it, skipping fc)."""
        return out

    def _guess(
        self, out: mx.array, params: SamplingParams, draws: Draws | None, i: int
    ) -> tuple[mx.array, mx.array]:
        """(guessed target id, the row the verifier reads) from the head's output."""
        raise NotImplementedError

    def propose(
        self,
        context: Sequence[int],
        k: int,
        params: SamplingParams,
        draws: Draws | None,
        confidence_floor: float | None,
    ) -> Draft:
        caught_up = self.catch_up(context)
        if caught_up is None:
            return Draft(tokens=[], source=self.name)  # nothing to draft from
        out, fed = caught_up
        guesses = []
        for i in range(k):
            guesses.append(self._guess(out, params, draws, i))
            if i + 1 < k:  # the head's own output is the next step's hidden state
                token = guesses[-1][0].astype(mx.uint32)
                out = self.head(self.embed(token), self._feedback(out), self.cache)
                fed += 1
        return device_draft(guesses, params, confidence_floor, k, fed, self.name)


class MTPDrafter(PairCache):
    """Guesses with the target's MTP head, from the target's own final hidden states."""

    name = "mtp"
    needs = HiddenSpec(final=True)

    def __init__(self, head: MTPHead, target: nn.Module, vocab_size: int | None = None):
        super().__init__(len(head.layers))
        self.head = head
        self.embed, self.lm_head = embedding_and_head(target)
        self.vocab_size = vocab_size

    def step_logits(self, out: mx.array) -> mx.array:
        """The head's outputs -> logits over the target's ids."""
        return self.lm_head(out)[:, : self.vocab_size]

    def add_hidden(self, start: int, hidden: Hidden) -> None:
        """Receives each target pass's hidden states (CachedModel's sink)."""
        self.hidden.add(start, hidden.final)

    def _guess(self, out: mx.array, params: SamplingParams, draws: Draws | None, i: int):
        logits = self.step_logits(out)
        if params.greedy:
            return mx.argmax(logits, axis=-1), logits
        row = probabilities(logits, params)
        return draws(row, i), row
