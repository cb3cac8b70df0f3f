"""A GGUF file as an mlx-lm model folder: what loading derives from its header (config.json,
the tokenizer's files) is written once to the macspec home, keyed by the file's identity, and
the weights are read from the file where it lies, never copied.

The folder's config.json names its file under `gguf`, so every reader of model folders
(templates, context length, tokenizer fingerprints, prompt-cache keys) works unchanged, and
the loader knows to read the weights from the file.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from macspec.errors import MacspecError
from macspec.models.gguf.archs import notices
from macspec.models.gguf.config import build_config, check_architecture
from macspec.models.gguf.header import MAGIC, GGUFHeader
from macspec.models.gguf.layout import default_layout
from macspec.models.gguf.report import deriving
from macspec.models.gguf.split import read_model_header
from macspec.models.gguf.tensors import compute_dtype, readable_types, unreadable
from macspec.models.gguf.tokenizer import eos_ids, write_tokenizer
from macspec.models.home import macspec_home, write_folder_whole

GGUF_KEY = "gguf"
"""config.json's entry naming the file: {"file": absolute path, "identity": its hash}."""
FORMAT = 2
"""The derived folder's layout and tokenizer; a change here derives every folder again (2: the
byte-level tokenizer fixes of issue 51)."""


def is_gguf_file(path: Path) -> bool:
    """A file that starts as a GGUF does (whatever its name)."""
    try:
        with open(path, "rb") as file:
            return file.read(4) == MAGIC
    except OSError:
        return False


def check_types(header: GGUFHeader) -> None:
    """One line naming a tensor type no converter reads."""
    refused = unreadable(header)
    if refused:
        name, qtype = refused[0]
        kinds = sorted({q.name for _, q in refused})
        readable = ", ".join(q.name for q in readable_types())
        raise MacspecError(
            f"{header.path}: tensor {name} is {qtype.name} ({', '.join(kinds)} in this file); "
            f"macspec reads GGUF tensors of types {readable}"
        )


def gguf_folder(path: Path) -> Path:
    """The derived model folder of a `.gguf` file (made on first use): one line for a path
    that is no readable GGUF model."""
    if str(path) in ("", "."):
        raise MacspecError("an empty model path")
    if path.is_dir():
        raise MacspecError(f"{path}: a folder, not a .gguf file")
    if not path.is_file():
        raise MacspecError(f"{path}: no such file")
    header = read_model_header(path.resolve(), strings=False)  # the vocabulary when deriving
    path = header.path  # a split model's first part, whichever part was named
    identity = header.identity()
    key = hashlib.sha256(f"{FORMAT}\0{path}\0{identity}".encode()).hexdigest()[:32]
    folder = macspec_home() / "gguf" / f"{path.stem[:48]}-{key}"
    if (folder / "config.json").is_file():
        return folder
    with deriving(path):
        header = read_model_header(path)
        check_architecture(header)
        check_types(header)
        config = build_config(header)
        config["eos_token_id"] = eos_ids(header)
        # What the model computes in, for every memory estimate that reads config.json (mlx-lm
        # itself ignores it: the weights' own dtypes decide).
        config["torch_dtype"] = compute_dtype(header, default_layout())
        config[GGUF_KEY] = {"file": str(path), "identity": identity}
        if notices(header):  # each load says them (a vision tower not used)
            config[GGUF_KEY]["notices"] = notices(header)
        _write_whole(folder, header, config)
    return folder


def _write_whole(folder: Path, header: GGUFHeader, config: dict[str, Any]) -> None:
    def fill(partial: Path) -> None:
        write_tokenizer(header, partial)
        (partial / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")

    write_folder_whole(folder, fill, "the converted GGUF folder")


def gguf_entry(folder: Path) -> dict[str, str] | None:
    """A derived folder's `gguf` entry ({"file", "identity"}), or None for any other folder."""
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    entry = config.get(GGUF_KEY) if isinstance(config, dict) else None
    return entry if isinstance(entry, dict) and "file" in entry else None


def gguf_notices(folder: Path) -> list[str]:
    """What loading a derived folder's file should say that is not an error; [] for any
    other folder."""
    entry = gguf_entry(folder) or {}
    said = entry.get("notices")
    return [str(line) for line in said] if isinstance(said, list) else []


def gguf_source(folder: Path) -> Path | None:
    """The GGUF file a derived folder reads its weights from, or None for any other folder."""
    entry = gguf_entry(folder)
    return Path(entry["file"]) if entry is not None else None
