"""The catalog of target/draft pairs: `models.toml` read and validated into frozen dataclasses.

The shipped catalog sits next to this module; a user `models.toml` in the macspec home is
merged over it (a user pair replaces a shipped pair of the same name). Each file is a list
of `[[pair]]` tables, so a name given twice in one file is detectable and reported.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from macspec.errors import MacspecError
from macspec.models import hub
from macspec.models.home import config_path, load_config, read_toml, user_catalog_path
from macspec.models.known import known_config
from macspec.models.memory import MemoryEstimate, estimate, weight_bytes
from macspec.models.resolved import (  # noqa: F401  (imported from here too)
    Pair,
    ResolvedModels,
    pair_model_path,
)

SHIPPED_CATALOG = Path(__file__).parent.parent / "models.toml"
DEFAULT_PAIR = "demo"
MAX_DRAFT_TOKENS = 64
"""The most guesses per cycle a pair or `--num-draft-tokens` may ask for."""
AUTO_DRAFT = "auto"
"""`--draft-model auto`: a draft among the models on this machine (see stores.pairing)."""
DRAFT_POLICIES = ("auto",)
"""Named draft-length policies a pair may recommend; an integer means a fixed k instead."""

_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


@dataclass(frozen=True)
class Catalog:
    """All known pairs: the shipped catalog with the user's merged over it."""

    pairs: dict[str, Pair]
    """Pairs by name, in file order (shipped first, then new user pairs)."""

    def get(self, name: str) -> Pair:
        """The pair called `name`, or a one-line error listing the known names."""
        try:
            return self.pairs[name]
        except KeyError:
            known = ", ".join(self.pairs) or "none"
            raise MacspecError(f"unknown pair '{name}' (known: {known})") from None


# field name -> (accepted types, description used in type errors)
_FIELDS: dict[str, tuple[tuple[type, ...], str]] = {
    "name": ((str,), "a string"),
    "target": ((str,), "a string"),
    "draft": ((str, list), "a string, or a list of strings (the first is the default)"),
    "draft_policy": ((str, int), 'a string ("auto") or an integer'),
    "context_length": ((int,), "an integer"),
    "description": ((str,), "a string"),
    "size_gb": ((int, float), "a number"),
    "mtp": ((str,), "a string"),
    "dflash": ((str,), "a string"),
    "eagle3": ((str,), "a string"),
    "unsupported": ((list,), "a list of strings"),
    "ranks": ((int,), "an integer"),
    "gguf_layout": ((str,), '"compact" or "exact"'),
}


MAX_RANKS = 64
"""The most machines a pair may ask for (a sanity bound: a typo, not a cluster)."""
_OPTIONAL = {"draft", "mtp", "dflash", "eagle3", "unsupported", "ranks", "gguf_layout"}
"""Fields a pair may leave out (a target with no draft model drafts by prompt lookup)."""


def is_pair_name(name: str) -> bool:
    """Whether `name` can name a pair: lowercase letters, digits, '.', '_' or '-'."""
    return bool(_NAME.match(name))


def parse_catalog(data: dict[str, Any], source: Path) -> dict[str, Pair]:
    """Validate one parsed `models.toml` into pairs by name; errors are one line naming `source`."""
    unknown = [key for key in data if key != "pair"]
    if unknown:
        raise MacspecError(f"{source}: unknown top-level key '{unknown[0]}' (expected [[pair]])")
    entries = data.get("pair", [])
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise MacspecError(f"{source}: 'pair' must be an array of tables ([[pair]])")
    pairs: dict[str, Pair] = {}
    for index, entry in enumerate(entries, start=1):
        pair = _parse_pair(entry, f"{source}: pair #{index}")
        if pair.name in pairs:
            raise MacspecError(f"{source}: duplicate pair name '{pair.name}'")
        pairs[pair.name] = pair
    return pairs


def _parse_pair(entry: dict[str, Any], where: str) -> Pair:
    name = entry.get("name")
    if isinstance(name, str):
        where = f"{where.rpartition(': ')[0]}: pair '{name}'"
    for key in entry:
        if key not in _FIELDS:
            raise MacspecError(f"{where}: unknown key '{key}' (known: {', '.join(_FIELDS)})")
    for key, (types, description) in _FIELDS.items():
        if key not in entry:
            if key in _OPTIONAL:
                continue
            raise MacspecError(f"{where}: missing field '{key}'")
        value = entry[key]
        if isinstance(value, bool) or not isinstance(value, types):
            raise MacspecError(f"{where}: '{key}' must be {description}")
    if not _NAME.match(entry["name"]):
        raise MacspecError(
            f"{where}: name must be lowercase letters, digits, '.', '_' or '-' (no slash)"
        )
    policy = entry["draft_policy"]
    if isinstance(policy, str) and policy not in DRAFT_POLICIES:
        named = " or ".join(f'"{p}"' for p in DRAFT_POLICIES)
        raise MacspecError(f"{where}: draft_policy must be {named} or an integer")
    if isinstance(policy, int) and not 1 <= policy <= MAX_DRAFT_TOKENS:
        raise MacspecError(
            f"{where}: a fixed draft_policy must be between 1 and {MAX_DRAFT_TOKENS}"
        )
    if entry["context_length"] < 1:
        raise MacspecError(f"{where}: context_length must be positive")
    if not 1 <= entry.get("ranks", 1) <= MAX_RANKS:
        raise MacspecError(
            f"{where}: ranks (machines the target is sharded over) must be between 1 and "
            f"{MAX_RANKS}"
        )
    if entry.get("gguf_layout", "compact") not in ("compact", "exact"):
        raise MacspecError(f'{where}: gguf_layout must be "compact" or "exact"')
    if not math.isfinite(entry["size_gb"]) or entry["size_gb"] < 0:
        raise MacspecError(f"{where}: size_gb must be finite and not negative")
    notes = entry.get("unsupported", [])
    if not all(isinstance(note, str) for note in notes):
        raise MacspecError(f"{where}: 'unsupported' must be a list of strings")
    drafts = entry.get("draft")
    if isinstance(drafts, list):
        if not drafts or not all(isinstance(d, str) for d in drafts):
            raise MacspecError(f"{where}: 'draft' as a list must hold one string or more")
        if len(set(drafts)) < len(drafts):
            raise MacspecError(f"{where}: 'draft' lists a model twice")
        entry = {**entry, "draft": drafts[0], "more_drafts": tuple(drafts[1:])}
    fields = {**entry, "size_gb": float(entry["size_gb"]), "unsupported": tuple(notes)}
    return Pair(**{"draft": None, **fields})


def load_catalog() -> Catalog:
    """The shipped catalog merged with the user's `models.toml` (user pairs win by name)."""
    pairs = parse_catalog(read_toml(SHIPPED_CATALOG), SHIPPED_CATALOG)
    user_file = user_catalog_path()
    if user_file.exists() and not user_file.is_file():
        raise MacspecError(f"{user_file}: a folder, not the TOML file of your pairs; move it aside")
    if user_file.is_file():
        pairs.update(parse_catalog(read_toml(user_file), user_file))
    return Catalog(pairs=pairs)


def default_pair_name() -> str:
    """The user config's `default_pair`, else "demo"."""
    return load_config().default_pair or DEFAULT_PAIR


def resolve_models(
    pair: str | None, model: str | None, draft_model: str | None, need_draft: bool = True
) -> ResolvedModels:
    """Turn `--pair` / `--model` / `--draft-model` into local model folders, offline.

    `--pair NAME` uses the pair (a `--draft-model` replaces its draft); `--model` alone means
    target-only decoding unless `--draft-model` is given; nothing at all means the default pair.
    A model that is not downloaded is a one-line error naming the `macspec pull` to run.
    With `need_draft` False (plain decoding, prompt lookup) the draft is not even looked up.
    """
    if pair is not None and model is not None:
        raise MacspecError("--pair and --model both given; pass one of them")
    if pair is not None and "+" in pair:  # TARGET+DRAFT: two names (pair names have no '+')
        model, draft_model = pair.split("+", 1)
    if model is not None:
        if not need_draft:
            draft_model = None
        target = hub.local_model_path(model)
        choice = None
        if draft_model == AUTO_DRAFT:  # the best draft on this machine, by tokenizer
            from macspec.models.stores.pairing import resolve_auto

            draft_model, choice = resolve_auto(model, target)
        draft = hub.local_model_path(draft_model) if draft_model is not None else None
        notes, params = _store_facts(model, draft_model)
        return ResolvedModels(target, draft, model, draft_model, None, (), notes, params, choice)
    if draft_model == AUTO_DRAFT and need_draft:
        raise MacspecError("--draft-model auto finds a draft for a --model; a pair has its own")
    catalog = load_catalog()
    if pair is not None:
        chosen = catalog.get(pair)
    else:
        name = default_pair_name()
        if name not in catalog.pairs:
            known = ", ".join(catalog.pairs)
            raise MacspecError(
                f"{config_path()}: default_pair '{name}' is not a known pair (known: {known})"
            )
        chosen = catalog.pairs[name]
    target_path = pair_model_path(chosen, chosen.target)
    if not need_draft:
        return ResolvedModels(target_path, None, chosen.target, None, chosen)
    draft_name = draft_model if draft_model is not None else chosen.draft
    more: tuple[tuple[str, Path], ...] = ()
    if draft_model is not None:
        draft_path = hub.local_model_path(draft_model)
    elif chosen.draft is not None:
        draft_path = pair_model_path(chosen, chosen.draft)
        more = tuple((name, pair_model_path(chosen, name)) for name in chosen.more_drafts)
    else:
        draft_path = None
    return ResolvedModels(target_path, draft_path, chosen.target, draft_name, chosen, more)


def _store_facts(target: str, draft: str | None) -> tuple[tuple[str, ...], dict]:
    """Notes of both models and the target's params, for names a store resolved (the store
    lookup is a manifest read: cheap to repeat after `local_model_path`)."""
    from macspec.models import stores

    found = [stores.find(name) if name is not None else None for name in (target, draft)]
    notes = tuple(note for entry in found if entry is not None for note in entry.notes)
    return notes, dict(found[0].params) if found[0] is not None else {}


def context_length(resolved: ResolvedModels) -> int | None:
    """The context window of resolved models: the pair's `context_length`, else
    `max_position_embeddings` from the target's config.json; None when neither says."""
    if resolved.pair is not None:
        return resolved.pair.context_length
    try:
        config = json.loads((resolved.target / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    value = config.get("max_position_embeddings") if isinstance(config, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


@dataclass(frozen=True)
class PairStatus:
    """A pair as it stands on this machine: what is downloaded, its size, its memory need."""

    pair: Pair
    """The catalog entry."""
    target_path: Path | None
    """Local folder of the target, or None when it is not (completely) downloaded."""
    draft_path: Path | None
    """Local folder of the draft, or None when it is not (completely) downloaded."""
    target_size_bytes: int | None
    """Bytes of the target's files on disk; None when not downloaded."""
    draft_size_bytes: int | None
    """Bytes of the draft's files on disk; None when not downloaded."""
    memory: MemoryEstimate
    """Weights plus full-context KV caches, and whether that fits this machine."""

    missing: tuple[str, ...] = ()
    """Members of the pair not (completely) downloaded."""

    @property
    def downloaded(self) -> bool:
        """Every member of the pair is here."""
        return not self.missing


def pair_status(pair: Pair) -> PairStatus:
    """Look a pair up on disk (offline) and estimate its memory."""
    found = {m: hub.find_local(m) for m in pair.members}
    paths = [found[pair.target], found.get(pair.draft) if pair.draft else None]
    sizes = [hub.size_on_disk(p) if p is not None else None for p in paths]
    present = list(found.values())
    drafters = 0  # weights every rank holds whole; until pulled, the download counts as split
    if all(p is not None for p in present):
        weights = sum(weight_bytes(p) for p in present)  # type: ignore[arg-type]
        drafters = weights - weight_bytes(found[pair.target])  # type: ignore[arg-type]
    else:
        weights = int(pair.size_gb * 1e9)
    configs = [_model_config(name, path) for name, path in found.items()]  # the target first
    # Not downloaded: the architecture facts the catalog ships, marked as an estimate.
    known = [known_config(name) if c is None else None for name, c in zip(found, configs)]
    estimated = any(k is not None for k in known)
    configs = [c if c is not None else k for c, k in zip(configs, known)]
    memory = estimate(weights, configs, pair.context_length, estimated, pair.ranks, drafters)
    missing = tuple(m for m, p in found.items() if p is None)
    return PairStatus(pair, paths[0], paths[1], sizes[0], sizes[1], memory, missing)


def _model_config(name: str, path: Path | None) -> dict | None:
    """A model's config.json from its folder, or from a partial download in the cache."""
    if path is not None:
        try:
            return json.loads((path / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
    return hub.cached_config(name) if hub.is_repo_id(name) else None
