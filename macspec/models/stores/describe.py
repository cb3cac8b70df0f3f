"""One model file or folder described from its metadata alone (never its weights): format,
size, quantization, architecture, context length, memory at that context, and the tokenizer
fingerprint it is paired by."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from macspec.errors import MacspecError
from macspec.models.gguf.split import check_parts, read_model_header
from macspec.models.memory import MemoryEstimate, estimate, weight_bytes
from macspec.models.stores.header import read_header


@dataclass(frozen=True)
class Description:
    """What a model's metadata says about it."""

    format: str
    """'gguf' or 'mlx'."""
    size_bytes: int
    """The weights on disk (the GGUF file; an MLX folder's safetensors)."""
    quantization: str | None
    """GGUF's file type (`Q4_K_M`), or MLX's bits (`4-bit`); None: not quantized / not said."""
    architecture: str | None
    """GGUF's `general.architecture`, or config.json's `model_type`."""
    context_length: int | None
    """The context window the model was trained for."""
    memory: MemoryEstimate | None
    """Weights (a GGUF's as converted, what `run` checks) plus a KV cache at the full context,
    against this machine's memory."""
    tokenizer: str | None
    """The tokenizer fingerprint: a hash of the vocabulary and merges (see `header`)."""
    vocab_size: int | None = None
    carried_drafts: tuple[str, ...] = ()
    """Drafters the model carries inside it ('dflash': an Ollama manifest's `draft.`; 'mtp':
    its own MTP layer)."""


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def file_type_name(value: Any) -> str | None:
    """GGUF's `general.file_type` as llama.cpp names it (`MOSTLY_Q4_K_M` -> `Q4_K_M`)."""
    if not isinstance(value, int) or isinstance(value, bool):
        return None
    import gguf  # its enum is the list of names; imported only when a GGUF is described

    try:
        return gguf.LlamaFileType(value).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    except ValueError:
        return f"type {value}"


def describe_gguf(path: Path, file_type: str | None = None) -> Description:
    """A GGUF file from its header; `file_type` (Ollama's config says it) when the header's
    own `general.file_type` is missing."""
    from macspec.models.gguf.layout import default_layout  # mlx: not at start-up
    from macspec.models.gguf.mtp import nextn_layers
    from macspec.models.gguf.tensors import compute_dtype, resident_bytes

    layout = default_layout()  # a bad MACSPEC_GGUF_LAYOUT is its own line, not the file's
    try:  # one read: the metadata, the tensor table (no vocabulary) and a split model's parts
        header = read_model_header(path, strings=False)
        size = header.size
        resident, dtype = resident_bytes(header, layout), compute_dtype(header, layout)
    except MacspecError:  # no readable tensor table: described from the metadata alone
        header = read_header(path)
        # a split model's first part describes it; its size is every part's
        size = sum(part.stat().st_size for part in check_parts(path, header.metadata))
        resident, dtype = size, None  # the file's size; None: the usual float16
    architecture = header.metadata.get("general.architecture")
    context = _int(header.arch_value("context_length"))
    heads = _int(header.arch_value("attention.head_count"))
    config = {
        "num_hidden_layers": header.arch_value("block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": _int(header.arch_value("attention.head_count_kv")) or heads,
        "head_dim": _int(header.arch_value("attention.key_length")),
        "hidden_size": header.arch_value("embedding_length"),
        "sliding_window": _int(header.arch_value("attention.sliding_window")),
    }
    config["torch_dtype"] = dtype  # KV values: 2 bytes or 4
    memory = estimate(resident, [config], context) if context else None
    return Description(
        "gguf",
        size,
        file_type_name(header.metadata.get("general.file_type")) or file_type,
        architecture if isinstance(architecture, str) else None,
        context,
        memory,
        header.tokenizer_digest,
        header.array_lengths.get("tokenizer.ggml.tokens"),
        ("mtp",) if nextn_layers(header) else (),
    )


def describe_mlx(folder: Path) -> Description:
    """An MLX (or Hugging Face) model folder from its config.json and tokenizer.json."""
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    if not isinstance(config, dict):
        raise ValueError("config.json is not a JSON object")
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    context = _int(text.get("max_position_embeddings"))
    quantization = config.get("quantization") or config.get("quantization_config")
    bits = quantization.get("bits") if isinstance(quantization, dict) else None
    size = weight_bytes(folder)
    memory = estimate(size, [config], context) if context else None
    model_type = config.get("model_type")
    return Description(
        "mlx",
        size,
        f"{bits}-bit" if _int(bits) else None,
        model_type if isinstance(model_type, str) else None,
        context,
        memory,
        mlx_tokenizer_digest(folder),
        _int(text.get("vocab_size")),
    )


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "merges.txt")
"""The files whose bytes make an MLX folder's tokenizer fingerprint."""


def mlx_tokenizer_digest(folder: Path) -> str | None:
    """A fingerprint of the folder's tokenizer files, byte for byte (parsing a 30 MB
    tokenizer.json would take most of a listing's time); None without one. Conversions of one
    family copy the same files, so they match; a reformatted copy only misses a pair. Not
    comparable with a GGUF's (GGUF's own bytes): pairs are made within one format."""
    return tokenizer_files_digest({name: folder / name for name in TOKENIZER_FILES})


def tokenizer_files_digest(files: dict[str, Path]) -> str | None:
    """`mlx_tokenizer_digest` of files by name wherever they lie (an Ollama manifest's JSON
    blobs hold a folder's tokenizer.json): the same files give the same fingerprint."""
    h = hashlib.sha256()
    found = False
    for name in TOKENIZER_FILES:
        path = files.get(name)
        if path is not None and path.is_file():
            found = True
            h.update(name.encode() + b"\0")
            with path.open("rb") as file:
                for block in iter(lambda: file.read(1 << 20), b""):
                    h.update(block)
    return h.hexdigest() if found else None
