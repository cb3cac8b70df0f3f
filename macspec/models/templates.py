"""Turning user text into prompt ids: the tokenizer's chat template, or raw text."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from macspec.errors import MacspecError

NO_TEMPLATE = "the model has no chat template: the prompt is fed raw (as with --raw)"
"""The warning of run and chat for a model without a chat template (a base model)."""


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "has_chat_template", False))


def unused_template_options(tokenizer, system: str | None, think: bool | None) -> list[str]:
    """Warnings for a tokenizer without a chat template (the prompt goes as plain text, and
    --system and --think are not used), or whose template cannot use --think: only a
    template that reads `enable_thinking` (Qwen3, Qwen3.5) can switch thinking."""
    if not has_chat_template(tokenizer):  # one line: the prompt itself changes meaning too
        think_flag = "--think" if think else "--no-think"
        given = [f for f, v in (("--system", system), (think_flag, think)) if v is not None]
        unused = f"; {' and '.join(given)} {'are' if len(given) > 1 else 'is'} not used"
        return [f"{NO_TEMPLATE}{unused if given else ''}"]
    template = getattr(tokenizer, "chat_template", None)
    if think is not None and isinstance(template, str) and "enable_thinking" not in template:
        flag = "--think" if think else "--no-think"
        return [f"the model's chat template has no thinking switch: {flag} is not used"]
    return []


def template_args(think: bool | None = None, extra_json: str | None = None) -> dict[str, Any]:
    """Keyword arguments for the chat template: `--chat-template-args` JSON, then `--think`.

    `think` None keeps the template's own default (Qwen3 and Qwen3.5 think by default).
    """
    args: dict[str, Any] = {}
    if extra_json is not None:
        try:
            args = json.loads(extra_json)
        except ValueError as exc:
            raise MacspecError(f"--chat-template-args is not valid JSON: {exc}") from None
        if not isinstance(args, dict):
            raise MacspecError('--chat-template-args must be a JSON object, e.g. {"key": 1}')
    if think is not None:
        args["enable_thinking"] = think
    return args


def encode_messages(
    tokenizer,
    messages: Sequence[dict[str, Any]],
    args: dict[str, Any] | None = None,
    tools: Sequence[dict[str, Any]] | None = None,
) -> list[int]:
    """Chat messages -> ids, with the generation prompt for the assistant's next turn.

    `args` go to the template as they do with `tokenizer.apply_chat_template` (mlx-lm's
    `--chat-template-config`), e.g. {"enable_thinking": False}; `tools` (OpenAI's function
    shape) are rendered by the template itself, as the model was trained to read them.
    """
    extra = {"tools": list(tools)} if tools else {}
    ids = tokenizer.apply_chat_template(
        list(messages), add_generation_prompt=True, tokenize=True, **extra, **(args or {})
    )
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return [int(i) for i in ids]


def encode_prompt(
    tokenizer,
    text: str,
    raw: bool = False,
    system: str | None = None,
    args: dict[str, Any] | None = None,
) -> list[int]:
    """A one-shot prompt as ids: templated as a user turn (after `system`, if given) when the
    tokenizer has a template; raw text otherwise."""
    if not raw and has_chat_template(tokenizer):
        messages = [{"role": "system", "content": system}] if system else []
        return encode_messages(tokenizer, [*messages, {"role": "user", "content": text}], args)
    bos = getattr(tokenizer, "bos_token", None)
    # As mlx-lm does: add the BOS unless the text already starts with it.
    add_special = bos is None or not text.startswith(bos)
    return [int(i) for i in tokenizer.encode(text, add_special_tokens=add_special)]
