"""A GGUF's tokenizer as the files of a Hugging Face tokenizer (tokenizer.json and
tokenizer_config.json with the chat template), so mlx-lm's `load_tokenizer` makes it a
TokenizerWrapper like any folder's: templates, stop ids and streaming detokenizers alike.

The vocabulary is rebuilt by transformers' torch-free converter (`convert_gguf_tokenizer`:
byte-level BPE, SentencePiece with scores and byte fallback, control tokens from `token_type`).
What llama.cpp does beyond it is set here: the split its `tokenizer.ggml.pre` name gives
(pretokenizers.py), BOS insertion from `tokenizer.ggml.add_bos_token` (or llama.cpp's default
for the vocabulary), whole-word lookups before merges for Llama 3's pre-tokenizer, Qwen's NFC
normalization, and no token past the file's vocabulary.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from macspec.errors import MacspecError
from macspec.models.gguf.header import GGUFHeader
from macspec.models.gguf.pretokenizers import llamacpp_pre_tokenizer

END_OF_TURN_TEXTS = frozenset(
    {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|eom_id|>", "<EOT>", "<|endoftext|>"}
    | {"<|end_of_text|>"}
)
"""Control tokens llama.cpp also ends generation on, by their text (a chat model's end of turn,
or of text: Llama 3 Instruct's files name <|eot_id|> EOS, and its text ends in <|end_of_text|>)."""
CONTROL = 3
"""llama.cpp's token type of a control token."""
LLAMA3_PRE = frozenset(
    {"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"}
    | {"jina-v5-nano"}
)
"""Pre-tokenizers llama.cpp reads as Llama 3's (llama-vocab.cpp): a word that is a token is
taken whole before any merge (tokenizers' `ignore_merges`), and BOS is added by default."""
WHOLE_WORD_PRE = LLAMA3_PRE | {"minicpm5", "youtu", "glm4", "glm5", "tekken"}
"""Pre-tokenizers llama.cpp also sets `ignore_merges` for (llama-vocab.cpp; and for
granite-embed-multi-97m, an embedding model macspec does not run)."""
BOS_PRE = LLAMA3_PRE | {"tekken", "chameleon"}
"""Pre-tokenizers llama.cpp adds BOS for where the file does not say."""
NFC_PRE = frozenset({"qwen2"})
"""Pre-tokenizers whose published tokenizer.json normalizes text to NFC first (Qwen2 to Qwen3)."""


def _plain(value: Any) -> Any:
    return value.tolist() if isinstance(value, np.ndarray) else value


def eos_ids(header: GGUFHeader) -> list[int]:
    """End of generation: the EOS, EOT and EOM ids the file names, and its control tokens whose
    text ends a turn."""
    meta = header.metadata
    ids = [meta.get(f"tokenizer.ggml.{key}_token_id") for key in ("eos", "eot", "eom")]
    tokens = meta.get("tokenizer.ggml.tokens") or []
    types = _plain(meta.get("tokenizer.ggml.token_type", []))
    for index, token in enumerate(tokens):
        if token in END_OF_TURN_TEXTS and index < len(types) and types[index] == CONTROL:
            ids.append(index)
    return sorted({int(i) for i in ids if i is not None})


def _as_published(backend: Any, given: dict[str, Any]) -> Any:
    """The converted byte-level tokenizer made to encode as the model's own does: llama.cpp's
    split for the file's pre-tokenizer name, Llama 3's whole-word lookups, Qwen's NFC, and
    without the tokens the converter's GPT-2 class adds on its own (`<|endoftext|>` past a
    Llama 3 vocabulary: an id the model has no row for)."""
    from tokenizers import Tokenizer, normalizers

    pre = given.get("pre_tokenizer_type")
    split_as_llamacpp = llamacpp_pre_tokenizer(pre)
    if split_as_llamacpp is not None:
        backend.pre_tokenizer = split_as_llamacpp
    if pre in WHOLE_WORD_PRE:
        backend.model.ignore_merges = True
    if pre in NFC_PRE:
        backend.normalizer = normalizers.NFC()
    size = len(given["tokens"])
    if max(backend.get_added_tokens_decoder(), default=-1) < size:
        return backend
    spec = json.loads(backend.to_str())  # tokenizers cannot remove an added token in place
    kept = [token for token in spec["added_tokens"] if token["id"] < size]
    return Tokenizer.from_str(json.dumps({**spec, "added_tokens": kept}))


def write_tokenizer(header: GGUFHeader, folder: Path) -> None:
    """tokenizer.json and tokenizer_config.json (with the chat template) into `folder`, or one
    line when the file has no tokenizer or one transformers cannot rebuild."""
    from tokenizers import processors

    # transformers says "PyTorch was not found" at import: advice for its model classes, which
    # macspec never uses (only its torch-free tokenizer converters): not a line for our users.
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.gguf.gguf_tokenizer_mapping import (
        GGUF_TOKENIZER_MAPPING,
        convert_gguf_tokenizer,
    )

    meta = header.metadata
    if not meta.get("tokenizer.ggml.tokens"):
        raise MacspecError(f"{header.path}: no tokenizer in the file (no tokenizer.ggml.tokens)")
    renames = GGUF_TOKENIZER_MAPPING["tokenizer"]
    given = {
        name: _plain(meta[f"tokenizer.{k}"])
        for k, name in renames.items()
        if f"tokenizer.{k}" in meta
    }
    if given.get("tokenizer_type") == "gpt2":
        given.setdefault("merges", [])  # a byte-level vocabulary may have none (not scores)
    try:
        backend, _ = convert_gguf_tokenizer(header.architecture, given)
    except (ValueError, KeyError, TypeError) as exc:
        reason = " ".join(str(exc).split())
        raise MacspecError(f"{header.path}: cannot rebuild its tokenizer: {reason}") from None
    byte_level = given.get("tokenizer_type") == "gpt2"
    if byte_level:
        backend = _as_published(backend, given)
    tokens = given["tokens"]

    def token(key: str) -> str | None:
        index = meta.get(f"tokenizer.ggml.{key}_token_id")
        return tokens[index] if index is not None and 0 <= index < len(tokens) else None

    bos = token("bos")
    # llama.cpp's default where the file does not say: BOS for SentencePiece and Llama 3's BPE.
    by_default = given.get("tokenizer_type") == "llama" or (
        byte_level and given.get("pre_tokenizer_type") in BOS_PRE
    )
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", by_default))
    if add_bos and bos is not None:
        bos_id = tokens.index(bos)
        backend.post_processor = processors.TemplateProcessing(
            single=f"{bos}:0 $A:0",
            pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
            special_tokens=[(bos, bos_id)],
        )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=bos,
        eos_token=token("eos"),
        unk_token=token("unknown"),
        pad_token=token("padding"),
        chat_template=meta.get("tokenizer.chat_template"),
        clean_up_tokenization_spaces=False,
    )
    fast.save_pretrained(str(folder))
