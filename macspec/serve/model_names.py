"""The names a served model answers to, the same on every route: the name it was given (a path,
a store name), the name the listings show (`NAME` on /v1/models, `NAME:latest` on Ollama's
/api/tags), and an Ollama store model's name with and without `ollama:`."""

from __future__ import annotations

from pathlib import Path

from macspec.models.gguf.split import PART_NAME

OLLAMA_PREFIX = "ollama:"
LATEST = ":latest"


def gguf_name(path: str) -> str:
    """A GGUF file's model name: its file name without `.gguf`, and without a split part's
    `-0000i-of-0000N` (any part of a split model names the whole model)."""
    match = PART_NAME.match(Path(path).name)
    return match["prefix"] if match is not None else Path(path).stem


def served_id(name: str) -> str:
    """The id /v1/models lists for a model given by `name`: a GGUF file's model name (no
    folder, `.gguf` or split part's suffix, as Ollama lists it); else the name given."""
    return gguf_name(name) if name.endswith(".gguf") else name


def is_tagged(name: str) -> bool:
    return ":" in name.rsplit("/", 1)[-1]


def listed_name(model_id: str) -> str:
    """The name Ollama's /api/tags lists for `model_id`, with a tag as Ollama's names have."""
    name = model_id.removeprefix(OLLAMA_PREFIX)
    if name.endswith(".gguf"):  # a file given by path: Ollama's names have no folders
        name = gguf_name(name)
    return name if is_tagged(name) else f"{name}{LATEST}"


def accepted_names(model_id: str, aliases: tuple[str, ...] = ()) -> frozenset[str]:
    """Every name a request may use: each one given, tagged `:latest` and not (Ollama's default
    tag), and the name /api/tags lists. A path stays as given (a path has no tag)."""
    names = {model_id, *aliases, listed_name(model_id)}
    for name in list(names):
        if name.endswith(".gguf") or name.startswith(("/", ".", "~")):
            continue
        names.add(name.removesuffix(LATEST))
        if not is_tagged(name):
            names.add(f"{name}{LATEST}")
    return frozenset(names)
