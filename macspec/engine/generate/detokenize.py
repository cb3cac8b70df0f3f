"""The streaming detokenizer of one answer: mlx-lm's, with its leading-space trim kept off when
the answer continues the prompt's own text.

mlx-lm's BPE and SentencePiece detokenizers drop a space that starts the first text they
flush: right for a chat answer (no reply starts with a space), wrong for a raw completion,
where `The three primary colors are` + ` the` must not read `arethe`.
"""

from __future__ import annotations

from typing import Any

from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, SPMStreamingDetokenizer


class _ContinuingBPE(BPEStreamingDetokenizer):
    """mlx-lm's BPE detokenizer without the trim (its token map is shared, not rebuilt)."""

    def _maybe_trim_space(self, current_text: str) -> str:
        return current_text


def answer_detokenizer(tokenizer: Any, continuation: bool) -> Any:
    """A fresh streaming detokenizer for one answer; `continuation` keeps a leading space."""
    detokenizer = tokenizer.detokenizer  # mlx-lm's: a copy per caller
    detokenizer.reset()  # the engine's contract with any tokenizer: reset, then add_token
    if not continuation:
        return detokenizer
    if isinstance(detokenizer, SPMStreamingDetokenizer):
        detokenizer.trim_space = False
    elif type(detokenizer) is BPEStreamingDetokenizer:
        detokenizer.__class__ = _ContinuingBPE
    return detokenizer  # the naive one decodes as the tokenizer does: nothing to undo
