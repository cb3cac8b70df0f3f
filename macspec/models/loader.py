"""Load a target and its draft with mlx-lm, and check they can work together."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.utils import load_config, load_tokenizer
from mlx_lm.utils import load_model as mlx_load_model

from macspec.engine.drafters.suffix import SaidTokens
from macspec.errors import MacspecError
from macspec.models.gguf.folder import gguf_notices, gguf_source
from macspec.models.gguf.load import PARTIAL, load_gguf_model
from macspec.models.stores.ollama_entry import tensor_entry
from macspec.models.stores.ollama_mlx_load import load_tensor_model
from macspec.models.tokenizers import fingerprint


@dataclass
class LoadedModels:
    """A target, its tokenizer, and optionally a compatible draft."""

    target: nn.Module
    tokenizer: object
    """mlx-lm's TokenizerWrapper of the target (the draft shares it)."""
    target_path: Path
    draft: nn.Module | None = None
    draft_path: Path | None = None
    vocab_size: int | None = None
    """Ids both models score; None when there is no draft or both tables are the same size."""
    warnings: list[str] = field(default_factory=list)
    """Things the user should know (printed by the CLI, shown by the TUI)."""
    heads: dict[str, nn.Module] = field(default_factory=dict)
    """Drafters that read the target's hidden states, by kind ('mtp', 'dflash')."""
    draft_name: str | None = None
    """The draft as the user or the catalog named it."""
    more_drafts: dict[str, nn.Module] = field(default_factory=dict)
    """A pair's further draft models, by name, loaded for `--draft auto` to measure."""
    said: SaidTokens = field(default_factory=SaidTokens)
    """Everything said to and by this target so far (`--draft suffix` guesses from it): one
    store for all the requests a server or a chat sends it."""


# transformers warns on stderr when a prompt passes the tokenizer's model_max_length; macspec
# checks the context window itself and says so in one line.
logging.getLogger("transformers.tokenization_utils_base").setLevel(logging.ERROR)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tiktoken.model", "vocab.json", "vocab.txt")
"""Files one of which a folder needs for mlx-lm to build its tokenizer."""


def check_folder(path: Path, role: str) -> None:
    """A model folder with config.json, whole weights and a tokenizer, or one line saying what
    is wrong: a truncated download or a missing tokenizer.json is named plainly rather than as
    whatever the loader trips over."""
    if not (path / "config.json").is_file():
        raise MacspecError(f"{role} {path}: not a model folder (no config.json)")
    for weights in sorted(path.glob("*.safetensors")):
        if weights.name.endswith(PARTIAL):  # a GGUF conversion's copy in progress, never read
            continue
        problem = safetensors_problem(weights)
        if problem is not None:
            raise MacspecError(f"{role} {path}: {weights.name} is {problem}; {_remedy(path)}")
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise MacspecError(
            f"{role} {path}: no tokenizer (none of {', '.join(TOKENIZER_FILES)}); "
            "the download is incomplete or this is not an mlx-lm model folder"
        )


def _remedy(path: Path) -> str:
    """What mends a folder's damaged weights: a GGUF's converted copy is macspec's own, made
    again once cleared; anything else came from a download."""
    source = gguf_source(path)
    if source is not None:
        return f"`macspec cache clear --model {source.name}` converts it again"
    return "download it again"


LOAD_ERRORS = (FileNotFoundError, ValueError, KeyError, OSError, RuntimeError)
"""What mlx-lm raises on a folder it cannot load (RuntimeError only from MLX's file reads)."""


def cannot_load(exc: Exception, path: Path, role: str) -> MacspecError:
    """The one-line error for a failed load; a RuntimeError that is no file's fault re-raises."""
    if isinstance(exc, RuntimeError) and not _is_load_error(exc):
        raise exc  # a bug, not a file: keep its traceback
    reason = " ".join(str(exc).split()) or type(exc).__name__  # whole, on one line
    return MacspecError(f"{role} {path}: cannot load: {reason}")


def load_model(path: Path, role: str, group=None) -> tuple[nn.Module, object]:
    """mlx_lm.load on a local folder (checked first), its failures turned into one-line errors;
    with an mlx.distributed `group`, mlx-lm's sharded load: each rank keeps its slice of every
    layer (tensor parallelism, `model.shard`). The tokenizer loads first: its transient peak
    (parsing a 151k-token vocabulary takes ~0.1 GB for a moment) then comes and goes before the
    weights are held, not on top of them."""
    check_folder(path, role)
    if group is not None:
        if gguf_source(path) is not None:
            raise MacspecError(f"{role} {gguf_source(path)}: a GGUF model cannot be sharded yet")
        if tensor_entry(path) is not None:
            raise MacspecError(f"{role} {path}: an Ollama MLX model cannot be sharded yet")
        try:
            return load_sharded(path, group)
        except AssertionError as exc:  # mlx-lm's sharded load asserts on what it cannot split
            raise cannot_load(ValueError(str(exc) or "cannot be sharded"), path, role) from None
        except LOAD_ERRORS as exc:
            raise cannot_load(exc, path, role) from None
    tokenizer = draft_tokenizer(path, role)
    return _checked_folder_weights(path, role), tokenizer


def load_sharded(path: Path, group) -> tuple[nn.Module, object]:
    """mlx-lm's `sharded_load` over `group`: tensor parallelism (`model.shard`, every layer
    split, an all-reduce per layer) where the architecture has it, else pipeline stages
    (`model.model.pipeline`, whole layers per rank; the weights need a safetensors index).
    Either way each rank reads only its part of the weights and every rank gets the same
    logits, so the engine's loop runs unchanged on every rank. A model with neither is refused
    by mlx-lm in a ValueError."""
    from mlx_lm.utils import load_model, sharded_load

    # A lazy load reads no weights: only which sharding the architecture offers.
    skeleton, _ = load_model(path, lazy=True, strict=False)
    if hasattr(skeleton, "shard"):
        return sharded_load(str(path), tensor_group=group)
    return sharded_load(str(path), pipeline_group=group)


def load_weights(path: Path, role: str) -> nn.Module:
    """The model alone (mlx-lm's load_model): its tokenizer is not loaded, only checked."""
    check_folder(path, role)
    return _checked_folder_weights(path, role)


def _checked_folder_weights(path: Path, role: str) -> nn.Module:
    """`load_weights` on a folder `check_folder` has passed already."""
    if gguf_source(path) is not None:
        model = load_gguf_model(path)
    elif tensor_entry(path) is not None:
        model = load_tensor_model(path)
    else:
        try:
            model = mlx_load_model(path)[0]
        except LOAD_ERRORS as exc:
            raise cannot_load(exc, path, role) from None
    # What the load freed (a converted file's float16 scales cast to float32, a conversion's
    # buffers) goes back to the system, not into MLX's cache for the whole run.
    mx.clear_cache()
    return model


def draft_tokenizer(path: Path, role: str = "draft model") -> object:
    """A model folder's tokenizer, with the end-of-sequence ids of its config (or of its
    generation_config), as mlx_lm.load gives it."""
    try:
        config = load_config(path)
        wrapper = load_tokenizer(path, eos_token_ids=config.get("eos_token_id"))
    except LOAD_ERRORS as exc:
        raise cannot_load(exc, path, role) from None
    drop_build_copies(wrapper._tokenizer)
    return wrapper


def drop_build_copies(tokenizer: object) -> None:
    """transformers 5's BPE classes (GPT-2's, Llama's, Qwen2's) keep the Python vocabulary and
    merges they built the Rust tokenizer from, and read them nowhere after `__init__`: about
    50 MB for a 151k vocabulary, held for the whole run."""
    for name in ("_vocab", "_merges"):
        vars(tokenizer).pop(name, None)


def _is_load_error(exc: RuntimeError) -> bool:
    """MLX's own errors reading a weights file ('[load_safetensors] ...', a JSON header)."""
    text = str(exc)
    return text.startswith("[load") or "safetensors" in text or "json.exception" in text


def safetensors_problem(path: Path) -> str | None:
    """Why a .safetensors file cannot be loaded ('truncated: ...'), or None when its header
    parses and its size is what the header says. Reads only the header."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as file:
            head = file.read(8)
            if len(head) < 8:
                return f"truncated ({size} bytes, not even a header)"
            header_size = int.from_bytes(head, "little")
            if header_size > min(size - 8, 100_000_000):
                return f"damaged or truncated (a {header_size}-byte header in {size} bytes)"
            header = json.loads(file.read(header_size))
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"
    except ValueError:  # also UnicodeDecodeError
        return "damaged (its header is not valid JSON)"
    if not isinstance(header, dict):
        return "damaged (its header is not a JSON object)"
    ends = [
        entry["data_offsets"][1]
        for name, entry in header.items()
        if name != "__metadata__" and isinstance(entry, dict) and "data_offsets" in entry
    ]
    expected = 8 + header_size + max(ends, default=0)
    if size < expected:
        return f"truncated ({size} of {expected} bytes)"
    return None


def weight_bytes(model: nn.Module) -> int:
    return sum(v.nbytes for _, v in tree_flatten(model.parameters()))


def output_vocab_size(model: nn.Module) -> int | None:
    args = getattr(model, "args", None)
    size = getattr(args, "vocab_size", None)
    return int(size) if size else None


def check_same_tokenizer(target_tok, draft_tok, target_name: str, draft_name: str) -> None:
    """Same ids for the same tokens, specials included: guesses are only comparable then."""
    target_vocab, draft_vocab = target_tok.get_vocab(), draft_tok.get_vocab()
    mismatch = f"{draft_name} cannot draft for {target_name}: their tokenizers differ"
    if len(target_vocab) != len(draft_vocab):
        raise MacspecError(f"{mismatch} ({len(target_vocab)} vs {len(draft_vocab)} tokens)")
    for token, token_id in target_vocab.items():
        if draft_vocab.get(token) != token_id:
            raise MacspecError(
                f"{mismatch} (token {token!r} is id {token_id} vs {draft_vocab.get(token)})"
            )
    target_eos, draft_eos = set(target_tok.eos_token_ids), set(draft_tok.eos_token_ids)
    if not target_eos & draft_eos:
        raise MacspecError(
            f"{mismatch} (end-of-sequence ids {sorted(target_eos)} vs {sorted(draft_eos)})"
        )


def load_checked_draft(
    loaded: LoadedModels, path: Path, target_name: str | None, name: str | None
) -> nn.Module:
    """A draft model for the loaded target: its tokenizer the target's, and the ids it scores
    narrowing `loaded.vocab_size` when its table is padded differently."""
    draft = load_weights(path, "draft model")
    # Fingerprints, cached by file hash: the draft's tokenizer loads only when unknown.
    target_print = fingerprint(loaded.target_path, lambda: loaded.tokenizer)
    draft_print = fingerprint(path, lambda: draft_tokenizer(path))
    if draft_print != target_print:  # the full comparison names the first difference
        check_same_tokenizer(
            loaded.tokenizer,
            draft_tokenizer(path),
            target_name or str(loaded.target_path),
            name or str(path),
        )
    sizes = [output_vocab_size(loaded.target), output_vocab_size(draft)]
    if None not in sizes and sizes[0] != sizes[1]:
        # Padded embedding tables (Qwen's 0.5B vs 7B): score only the ids both know.
        loaded.vocab_size = min(sizes[1], loaded.vocab_size or sizes[0])
        if loaded.vocab_size < target_print.size:
            raise MacspecError(
                f"{path} scores only {loaded.vocab_size} ids, fewer than the tokenizer has"
            )
    return draft


def load_models(
    target_path: Path,
    draft_path: Path | None = None,
    target_name: str | None = None,
    draft_name: str | None = None,
    group=None,
) -> LoadedModels:
    """Load the target and, if given, the draft; refuse a draft that cannot work with it.

    Names (repo ids, as the user gave them) are what errors show; paths are the fallback.
    With an mlx.distributed `group`, the target is sharded over its ranks and the draft is
    loaded whole on every rank.
    """
    target, tokenizer = load_model(target_path, "model", group)
    loaded = LoadedModels(target=target, tokenizer=tokenizer, target_path=target_path)
    loaded.warnings.extend(gguf_notices(target_path))
    if draft_path is None:
        return loaded
    draft = load_checked_draft(loaded, draft_path, target_name, draft_name)
    loaded.draft, loaded.draft_path = draft, draft_path
    loaded.draft_name = draft_name or str(draft_path)
    return loaded
