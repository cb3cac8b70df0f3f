"""Thinking models: reasoning apart from the answer.

Qwen3, Qwen3.5/3.6 and DeepSeek-R1 style models write their reasoning between `<think>` and
`</think>`, then the answer. Whether the answer starts inside the block depends on the chat
template: Qwen3.5's generation prompt opens it (`<think>\\n`), Qwen3's with `enable_thinking`
false closes an empty one. `ReasoningSplitter` follows the streamed text and tells each delta's
part: reasoning or answer. Text that may be the start of a tag is held back until it is clear.
"""

from __future__ import annotations

from dataclasses import dataclass

OPEN, CLOSE = "<think>", "</think>"


@dataclass(frozen=True)
class Split:
    """One delta of streamed text, divided."""

    reasoning: str = ""
    answer: str = ""


def has_think_tags(tokenizer) -> bool:
    """Whether the tokenizer knows `<think>` and `</think>` as single tokens."""
    try:
        return all(len(tokenizer.encode(t, add_special_tokens=False)) == 1 for t in (OPEN, CLOSE))
    except Exception:  # a tokenizer that cannot say has no tags for us
        return False


def opens_reasoning(prompt_text: str) -> bool:
    """Whether the rendered prompt leaves a `<think>` block open for the answer to fill."""
    return prompt_text.rfind(OPEN) > prompt_text.rfind(CLOSE)


def reasoning_start(tokenizer, prompt_ids: list[int]) -> bool | None:
    """How an answer to this prompt starts: True inside a `<think>` block, False outside it,
    None when the model has no think tags (its text is all answer)."""
    if not has_think_tags(tokenizer):
        return None
    return opens_reasoning(tokenizer.decode(prompt_ids))


class ReasoningSplitter:
    """Divides streamed answer text into reasoning and answer at the think tags.

    `inside`: the prompt opened the block (the text starts as reasoning). Otherwise the text
    is reasoning only if it starts with `<think>` (leading whitespace allowed). After
    `</think>` everything is answer, its leading newlines dropped.
    """

    def __init__(self, inside: bool = False):
        self._state = "reasoning" if inside else "start"
        self._held = ""
        self.reasoning = ""
        """All reasoning so far (tags excluded)."""
        self.answer = ""
        """All answer text so far."""

    @property
    def in_reasoning(self) -> bool:
        """Whether the text so far ends inside the reasoning block."""
        return self._state == "reasoning"

    def feed(self, delta: str) -> Split:
        text, self._held = self._held + delta, ""
        reasoning = answer = ""
        while text:
            if self._state == "start":
                stripped = text.lstrip()
                if stripped.startswith(OPEN):
                    self._state, text = "reasoning", stripped[len(OPEN) :]
                elif OPEN.startswith(stripped):  # maybe a tag still arriving
                    self._held, text = text, ""
                else:
                    self._state = "answer"
            elif self._state == "reasoning":
                at = text.find(CLOSE)
                if at >= 0:
                    reasoning += text[:at]
                    self._state, text = "after", text[at + len(CLOSE) :]
                    continue
                keep = _partial_tag(text, CLOSE)
                reasoning += text[: len(text) - keep]
                self._held, text = text[len(text) - keep :], ""
            elif self._state == "after":
                text = text.lstrip("\n")
                if text:
                    self._state = "answer"
            else:
                answer, text = answer + text, ""
        if self.reasoning == "" and reasoning:
            reasoning = reasoning.lstrip("\n")
        self.reasoning += reasoning
        self.answer += answer
        return Split(reasoning, answer)

    def flush(self) -> Split:
        """At the end: text held back for a tag that never came."""
        held, self._held = self._held, ""
        if not held:
            return Split()
        if self._state == "reasoning":
            self.reasoning += held
            return Split(reasoning=held)
        self.answer += held
        return Split(answer=held)


def _partial_tag(text: str, tag: str) -> int:
    """Length of the longest end of `text` that is a start of `tag` (held back)."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:size]):
            return size
    return 0


def split_text(text: str, inside: bool = False) -> tuple[str, str]:
    """(reasoning, answer) of a whole text."""
    splitter = ReasoningSplitter(inside)
    splitter.feed(text)
    splitter.flush()
    return splitter.reasoning.rstrip("\n"), splitter.answer
