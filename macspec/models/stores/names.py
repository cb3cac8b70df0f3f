"""Store names on the command line: `ollama:NAME[:TAG]`, `lmstudio:PUBLISHER/REPO[/FILE.gguf]`,
and a bare `NAME:TAG` (Ollama's, as its CLI takes it) when the name is no path; Hugging Face
repo ids never hold a ':', so the two cannot be confused."""

from __future__ import annotations

from pathlib import Path

from macspec.errors import MacspecError
from macspec.models.stores import lmstudio, ollama, ollama_mlx
from macspec.models.stores.entry import StoreModel

FORMS = (
    "a model folder, a .gguf file, a Hugging Face repo id (ORG/NAME), "
    f"{ollama.PREFIX}NAME[:TAG] (or NAME:TAG) or {lmstudio.FORM}"
)
"""Every form a model name may take, for the one-line error on anything else."""


def is_store_name(name: str) -> bool:
    """True for a name that only a store can resolve (an explicit prefix, or a bare Ollama
    `NAME:TAG` that is not an existing path)."""
    if name.startswith((ollama.PREFIX, lmstudio.PREFIX)):
        return True
    return (
        ":" in name and not Path(name).expanduser().exists() and ollama.parse_name(name) is not None
    )


def find(name: str) -> StoreModel | None:
    """The store model `name` names, read where it lies; None when `name` is not a store name.
    A store name that does not resolve is a one-line error."""
    if name.startswith(ollama.PREFIX):
        return ollama.resolve(name.removeprefix(ollama.PREFIX), name, ollama_mlx.tensor_folder)
    if name.startswith(lmstudio.PREFIX):
        return lmstudio.resolve(name.removeprefix(lmstudio.PREFIX), name)
    if is_store_name(name) or _bare_ollama_name(name):
        return ollama.resolve(name, name, ollama_mlx.tensor_folder)
    return None


def _bare_ollama_name(name: str) -> bool:
    """A bare `NAME` that Ollama's store holds as `NAME:latest` (Ollama's default tag), and
    that is neither a path nor a repo id (those have a '/')."""
    if "/" in name or ":" in name or Path(name).expanduser().exists():
        return False
    parsed = ollama.parse_name(name)
    root = ollama.store_root()
    return parsed is not None and root.is_dir() and ollama.find_manifest(parsed, root) is not None


def store_names() -> list[str]:
    """The names of the models in Ollama's and LM Studio's stores (paths only: no file read)."""
    names = [found.short for found, _ in ollama.manifests()]
    for root in lmstudio.store_roots():
        names += [f"{lmstudio.PREFIX}{r.parent.name}/{r.name}" for r in lmstudio.repos(root)]
    return names


def nearest(name: str, limit: int = 3) -> list[str]:
    """Store names close to `name` (as `ollama run` suggests): those it starts, else similar."""
    import difflib

    known = store_names()
    bare = name.lower().removeprefix(ollama.PREFIX)
    starting = [k for k in known if k.lower().startswith((bare + ":", bare + "/"))]
    if starting:
        return starting[:limit]
    by_tail = {k.rsplit("/", 1)[-1].lower(): k for k in known}  # LM Studio: the repo's name
    close = difflib.get_close_matches(bare, [*by_tail, *known], n=limit, cutoff=0.6)
    return list(dict.fromkeys(by_tail.get(c, c) for c in close))[:limit]


def not_a_model(name: str) -> MacspecError:
    """The one line for a name that is none of the accepted forms, with the nearest store names."""
    close = nearest(name) if name.strip() else []
    hint = f"; on this Mac: {', '.join(close)}" if close else ""
    return MacspecError(f"'{name}' is not a model name: give {FORMS}{hint}")
