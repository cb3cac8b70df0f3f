"""Engine events rendered as OpenAI chat completions (and legacy completions): whole objects,
and stream chunks as OpenAI sends them (a first chunk with the role, content deltas, tool-call
deltas, a last chunk with the finish reason, then, with `stream_options.include_usage`, a chunk
with `usage` and no choices).

A thinking model's reasoning goes to `reasoning_content`, its answer to `content`, its tool
calls to `tool_calls` (`finish_reason: "tool_calls"`). Every response also carries a `macspec`
object: the speculation figures of the generation.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from macspec.engine.core.events import Done, Prefill, Token
from macspec.engine.core.stats import sources_line
from macspec.models.answer_stream import AnswerStream, Call, Piece, Reasoning


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


def finish_reason(done: Done, called: bool = False) -> str:
    """OpenAI's finish reason: 'length' at max_tokens or the context window (as OpenAI's API
    says both), 'tool_calls' when the answer called tools, 'stop' at EOS or a stop string.
    The `macspec` object tells 'length' and 'context' apart."""
    if done.finish_reason in ("length", "context"):
        return "length"
    return "tool_calls" if called else "stop"


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
        "by_source": {
            name: {"proposed": proposed, "accepted": accepted}
            for name, (proposed, accepted) in stats.by_source.items()
        },
        "by_source_line": sources_line(stats.by_source),
        "k": meta.k,
        "acceptance": stats.acceptance_rate,
        "tokens_per_pass": stats.tokens_per_pass,
        "draft_proposed": stats.draft_proposed,
        "draft_accepted": stats.draft_accepted,
        "target_passes": stats.target_passes,
        "rows_per_pass": stats.rows_per_pass,
        "tree_cycles": stats.tree_cycles,
        "tree_nodes_per_cycle": stats.tree_nodes / stats.tree_cycles if stats.tree_cycles else None,
        "tree_note": stats.tree_note,
        "prefilled_tokens": stats.prefilled_tokens,
        "ttft_s": stats.ttft_s,
        "tokens_per_s": stats.decode_tokens_per_s,
        "queued_s": queued_s,
        "finish_reason": done.finish_reason,
    }


class Renderer:
    """One generation as OpenAI chat completion chunks and response (`chat`), or as a legacy
    text completion's (no reasoning, no tools)."""

    def __init__(self, meta: Meta, chat: bool, answer: AnswerStream | None = None):
        self.meta = meta
        self.chat = chat
        self.answer = answer if answer is not None and chat else AnswerStream()
        self.object = "chat.completion" if chat else "text_completion"
        self.calls_sent = 0

    # -- streaming -------------------------------------------------------------------------
    def opening(self) -> list[str]:
        """The chunk that opens a chat stream (OpenAI sends the role first)."""
        return [sse(self._chunk({"role": "assistant", "content": ""}))] if self.chat else []

    def prefilled(self, event: Prefill) -> list[str]:
        return []

    def token(self, event: Token) -> list[str]:
        return [sse(c) for c in self._piece_chunks(self.answer.feed(event.text))]

    def closing(self, done: Done, queued_s: float) -> list[str]:
        """Text held back until the end, the finish chunk with the figures, the usage chunk."""
        chunks = self._piece_chunks(self.answer.feed(done.tail) + self.answer.finish())
        end = self._chunk({} if self.chat else "", finish_reason(done, bool(self.answer.calls)))
        end["macspec"] = figures(self.meta, done, queued_s)
        chunks.append(end)
        if self.meta.include_usage:
            chunks.append({**self._envelope(), "choices": [], "usage": usage(self.meta, done)})
        return [*(sse(c) for c in chunks), sse("[DONE]")]

    def keepalive(self) -> str:
        return ": keep-alive\n\n"

    def failed(self, message: str) -> list[str]:
        from macspec.serve.errors import error_body

        return [sse(error_body(500, message))]

    def summary(self) -> str:
        calls = len(self.answer.calls)
        return f"{calls} tool call{'s' if calls != 1 else ''}" if calls else ""

    def _piece_chunks(self, pieces: list[Piece]) -> list[dict[str, Any]]:
        chunks = []
        for piece in pieces:
            if isinstance(piece, Reasoning):
                chunks.append(self._chunk({"reasoning_content": piece.text}))
            elif isinstance(piece, Call):
                # OpenAI's order: the id and name first, then the arguments (in one fragment).
                index, call = self.calls_sent, piece.call
                self.calls_sent += 1
                function = {"name": call.name, "arguments": ""}
                opened = {"index": index, "id": call_id(call.id), "type": "function"}
                chunks.append(self._chunk({"tool_calls": [{**opened, "function": function}]}))
                arguments = {"index": index, "function": {"arguments": call.arguments_json}}
                chunks.append(self._chunk({"tool_calls": [arguments]}))
            elif self.chat:
                chunks.append(self._chunk({"content": piece.text}))
            else:
                chunks.append(self._chunk(piece.text))
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

    def absorb(self, event: Token) -> None:
        self.answer.feed(event.text)

    # -- whole responses -------------------------------------------------------------------
    def whole(self, done: Done, queued_s: float) -> dict[str, Any]:
        """The non-streamed response object."""
        answer = finished(self.answer, done)
        if self.chat:
            calls = [
                {
                    "id": call_id(c.id),
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments_json},
                }
                for c in answer.calls
            ]
            content = answer.text if answer.text or not calls else None
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if calls:
                message["tool_calls"] = calls
            if answer.reasoning:
                message["reasoning_content"] = answer.reasoning.rstrip("\n")
            choice = {"index": 0, "message": message}
        else:
            choice = {"index": 0, "text": answer.text}
        choice.update(logprobs=None, finish_reason=finish_reason(done, bool(answer.calls)))
        return {
            **self._envelope(),
            "object": self.object,
            "choices": [choice],
            "usage": usage(self.meta, done),
            "macspec": figures(self.meta, done, queued_s),
        }


def finished(answer: AnswerStream, done: Done) -> AnswerStream:
    """`answer` with the text held back until the end fed, and its parsers closed."""
    answer.feed(done.tail)
    answer.finish()
    return answer


def call_id(raw: str) -> str:
    """OpenAI's shape of a call id."""
    return raw if raw.startswith("call_") else f"call_{raw}"
