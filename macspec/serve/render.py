"""Engine events rendered as OpenAI responses: whole objects, and stream chunks as OpenAI
sends them (a first chunk with the role, content deltas, a last chunk with the finish reason,
then, with `stream_options.include_usage`, a chunk with `usage` and no choices).

A thinking model's reasoning goes to `reasoning_content`, its answer to `content`.
Every response also carries a `macspec` object: the speculation figures of the generation.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from macspec.engine.events import Done
from macspec.models.reasoning import ReasoningSplitter, Split


@dataclass(frozen=True)
class Meta:
    """What every response of one request repeats."""

    id: str
    created: int
    model: str
    prompt_tokens: int
    include_usage: bool = False
    draft: str | None = None
    """Where guesses come from ('model', 'lookup', 'hybrid'); None for plain decoding."""
    k: str | int | None = None
    """The draft-length setting: a number, or 'auto'."""


def new_meta(prefix: str, model: str, prompt_tokens: int, **figures: Any) -> Meta:
    unique = f"{prefix}-{uuid.uuid4().hex[:24]}"
    return Meta(unique, int(time.time()), model, prompt_tokens, **figures)


def sse(payload: dict[str, Any] | str) -> str:
    """One server-sent event."""
    if isinstance(payload, str):
        return f"data: {payload}\n\n"
    data = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return f"data: {data}\n\n"


def finish_reason(done: Done) -> str:
    """OpenAI's finish reason: 'length' at max_tokens or the context window (as OpenAI's API
    says both), 'stop' at EOS or a stop string. The `macspec` object tells the two apart."""
    return "length" if done.finish_reason in ("length", "context") else "stop"


def usage(meta: Meta, done: Done) -> dict[str, Any]:
    cached = max(0, meta.prompt_tokens - done.stats.prefilled_tokens)
    return {
        "prompt_tokens": meta.prompt_tokens,
        "completion_tokens": len(done.tokens),
        "total_tokens": meta.prompt_tokens + len(done.tokens),
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def figures(meta: Meta, done: Done, queued_s: float = 0.0) -> dict[str, Any]:
    """The `macspec` object: how speculation went for this generation."""
    stats = done.stats
    return {
        "draft": meta.draft,
        "k": meta.k,
        "acceptance": stats.acceptance_rate,
        "tokens_per_pass": stats.tokens_per_pass,
        "draft_proposed": stats.draft_proposed,
        "draft_accepted": stats.draft_accepted,
        "target_passes": stats.target_passes,
        "prefilled_tokens": stats.prefilled_tokens,
        "ttft_s": stats.ttft_s,
        "tokens_per_s": stats.decode_tokens_per_s,
        "queued_s": queued_s,
        "finish_reason": done.finish_reason,
    }


class Renderer:
    """Turns one generation's text into chunks and a final response; `kind` says which API."""

    def __init__(self, meta: Meta, chat: bool, reasoning_start: bool | None = None):
        self.meta = meta
        self.chat = chat
        self.splitter = ReasoningSplitter(reasoning_start) if reasoning_start is not None else None
        self.object = "chat.completion" if chat else "text_completion"

    # -- streaming -------------------------------------------------------------------------
    def first(self) -> list[dict[str, Any]]:
        """The chunk that opens a chat stream (OpenAI sends the role first)."""
        return [self._chunk({"role": "assistant", "content": ""})] if self.chat else []

    def delta(self, text: str) -> list[dict[str, Any]]:
        """Chunks for a text delta (none while text is held back)."""
        split = self.splitter.feed(text) if self.splitter is not None else Split(answer=text)
        return self._split_chunks(split)

    def last(self, done: Done, queued_s: float) -> list[dict[str, Any]]:
        """Text held back until the end, the finish chunk with the figures, the usage chunk."""
        chunks = self.delta(done.tail)
        if self.splitter is not None:
            chunks += self._split_chunks(self.splitter.flush())
        end = self._chunk({} if self.chat else "", finish_reason(done))
        end["macspec"] = figures(self.meta, done, queued_s)
        chunks.append(end)
        if self.meta.include_usage:
            chunks.append({**self._envelope(), "choices": [], "usage": usage(self.meta, done)})
        return chunks

    def _split_chunks(self, split: Split) -> list[dict[str, Any]]:
        chunks = []
        if split.reasoning:
            chunks.append(self._chunk({"reasoning_content": split.reasoning}))
        if split.answer:
            chunks.append(self._chunk({"content": split.answer} if self.chat else split.answer))
        return chunks

    def _envelope(self) -> dict[str, Any]:
        return {
            "id": self.meta.id,
            "object": self.object + (".chunk" if self.chat else ""),
            "created": self.meta.created,
            "model": self.meta.model,
            "system_fingerprint": None,
        }

    def _chunk(self, delta: dict[str, Any] | str, finish: str | None = None) -> dict[str, Any]:
        if self.chat:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": delta, "logprobs": None, "finish_reason": finish}
        chunk = {**self._envelope(), "choices": [choice]}
        if self.meta.include_usage:
            chunk["usage"] = None
        return chunk

    # -- whole responses -------------------------------------------------------------------
    def response(self, done: Done, queued_s: float) -> dict[str, Any]:
        """The non-streamed response object."""
        text = done.text
        reasoning = None
        if self.splitter is not None:
            self.splitter.feed(text)
            self.splitter.flush()
            text, reasoning = self.splitter.answer, self.splitter.reasoning.rstrip("\n") or None
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if reasoning is not None:
                message["reasoning_content"] = reasoning
            choice = {"index": 0, "message": message}
        else:
            choice = {"index": 0, "text": text}
        choice.update(logprobs=None, finish_reason=finish_reason(done))
        return {
            **self._envelope(),
            "object": self.object,
            "choices": [choice],
            "usage": usage(self.meta, done),
            "macspec": figures(self.meta, done, queued_s),
        }
