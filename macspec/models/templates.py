"""Turning user text into prompt ids: the tokenizer's chat template, or raw text."""

from __future__ import annotations

from collections.abc import Sequence


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "has_chat_template", False))


def encode_messages(tokenizer, messages: Sequence[dict[str, str]]) -> list[int]:
    """Chat messages -> ids, with the generation prompt for the assistant's next turn."""
    ids = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return [int(i) for i in ids]


def encode_prompt(tokenizer, text: str, raw: bool = False) -> list[int]:
    """A one-shot prompt as ids: templated as a user turn when the tokenizer has a template."""
    if not raw and has_chat_template(tokenizer):
        return encode_messages(tokenizer, [{"role": "user", "content": text}])
    bos = getattr(tokenizer, "bos_token", None)
    # As mlx-lm does: add the BOS unless the text already starts with it.
    add_special = bos is None or not text.startswith(bos)
    return [int(i) for i in tokenizer.encode(text, add_special_tokens=add_special)]
