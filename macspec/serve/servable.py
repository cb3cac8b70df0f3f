"""What `macspec serve` without `--model` serves: every model `macspec models` lists as
runnable (the stores' and the HF cache's readable models that fit this machine, and the catalog's
downloaded pairs), each with the names a request may call it by. Read from metadata alone."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from macspec.models.stores.describe import Description
from macspec.models.stores.listing import LocalModel
from macspec.models.stores.lmstudio import PREFIX as LMSTUDIO_PREFIX
from macspec.serve.model_names import OLLAMA_PREFIX, accepted_names, served_id


@dataclass(frozen=True)
class Servable:
    """One model the pool can load."""

    name: str
    """What `--model` (or `--pair`, for a catalog pair) takes."""
    model_id: str
    """The id /v1/models lists (a GGUF file's model name; else the name)."""
    names: frozenset[str]
    """Every name a request may use for it."""
    about: Description | None
    """Its metadata (None for a catalog pair: its members are described apart)."""
    path: Path | None
    required_bytes: int
    """Weights plus a KV cache at its full context: what loading it takes from the budget."""
    is_pair: bool = False


def local_servable(model: LocalModel) -> Servable | None:
    """A listed model as the pool serves it; None when it is unreadable, of an architecture
    macspec does not run, or cannot fit here."""
    about = model.about
    if about is None or not model.runnable:
        return None
    if about.memory is not None and about.memory.fits is False:
        return None
    model_id = served_id(model.name)
    aliases = [model.name]
    if model.store == "ollama":
        aliases.append(OLLAMA_PREFIX + model.name)
    if model.store == "lmstudio":  # as LM Studio's own server names it: PUBLISHER/REPO
        aliases.append(model.name.removeprefix(LMSTUDIO_PREFIX))
    if model.path is not None and model.path.suffix == ".gguf":
        aliases.append(str(model.path))
    required = about.memory.total_bytes if about.memory is not None else about.size_bytes
    return Servable(
        model.name, model_id, accepted_names(model_id, tuple(aliases)), about, model.path, required
    )


def pair_servables() -> list[Servable]:
    """The catalog's pairs whose every member is downloaded, by pair name."""
    from macspec.models.catalog import load_catalog, pair_status

    found = []
    for pair in load_catalog().pairs.values():
        status = pair_status(pair)
        if status.downloaded and status.memory.fits is not False:
            names = accepted_names(pair.name)
            memory = status.memory.total_bytes
            found.append(Servable(pair.name, pair.name, names, None, None, memory, True))
    return found


def servable_models() -> list[Servable]:
    """Everything `macspec serve` without `--model` serves, one entry per model id (the first
    found keeps an id two stores share)."""
    from macspec.models.stores.listing import local_models

    found = [s for s in map(local_servable, local_models()) if s is not None]
    by_id: dict[str, Servable] = {}
    for servable in [*found, *pair_servables()]:
        by_id.setdefault(servable.model_id, servable)
    return list(by_id.values())
