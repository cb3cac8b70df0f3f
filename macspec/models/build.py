"""From resolved model folders to a ready Engine: the one place the pieces are wired."""

from __future__ import annotations

from pathlib import Path

from macspec.engine.batch.engine import BatchEngine
from macspec.engine.caches.cached import DEFAULT_CACHE, CacheOptions
from macspec.engine.drafters.dflash import DFlashDrafter
from macspec.engine.drafters.eagle3 import Eagle3Drafter
from macspec.engine.drafters.lookup import HybridDrafter, LookupDrafter
from macspec.engine.drafters.model import ModelDrafter
from macspec.engine.drafters.mtp import MTPDrafter
from macspec.engine.drafters.protocol import Drafter
from macspec.engine.drafters.suffix import SuffixDrafter
from macspec.engine.generate.loop import Engine
from macspec.engine.policy.choice import DrafterChoice
from macspec.engine.policy.length import make_policy, tree_size
from macspec.engine.trees.sizing import make_tree_policy
from macspec.errors import MacspecError
from macspec.models.catalog import ResolvedModels
from macspec.models.drafters import (
    check_dflash,
    check_mtp,
    convert_mtp_checkpoint,
    drafter_kind,
    load_dflash,
    load_mtp,
    read_config,
)
from macspec.models.eagle3 import check_eagle3, load_eagle3
from macspec.models.flags import HEAD_KINDS, check_draft_flags, check_draft_tokens
from macspec.models.home import macspec_home
from macspec.models.loader import LoadedModels, load_checked_draft, load_models
from macspec.models.memory import kv_cache_bytes


def drafter_folders(resolved: ResolvedModels, draft: str | None) -> dict[str, Path]:
    """The drafter folders at hand, by kind: the draft folder (a draft model, an MTP head, a
    DFlash drafter or an EAGLE-3 head, told by its config) and the pair's own heads, when
    `draft` asks for them."""
    folders: dict[str, Path] = {}
    if resolved.draft is not None:
        kind = drafter_kind(resolved.draft)
        folders["mtp" if kind == "mtp-checkpoint" else kind] = resolved.draft
    for kind in HEAD_KINDS:
        if kind not in folders and draft in (kind, "auto"):
            path = resolved.head(kind)
            if path is not None:
                folders[kind] = path
    return folders


def choose_source(draft: str | None, folders: dict[str, Path]) -> str:
    """`--draft`, checked against the drafters at hand; by default the draft folder's kind
    (a draft model first), or prompt lookup without one."""
    default = next((k for k in ("model", *HEAD_KINDS) if k in folders), "lookup")
    source = draft or default
    needs = {"model": "model", "hybrid": "model", **{k: k for k in HEAD_KINDS}}.get(source)
    if needs is not None and needs not in folders:
        what = {
            "model": "a draft model",
            "mtp": "an MTP head",
            "dflash": "a DFlash drafter",
            "eagle3": "an EAGLE-3 head",
        }
        if not folders:
            raise MacspecError(
                f"--draft {source} needs {what[needs]} (--draft-model, or a pair that has one), "
                "but there is no drafter; --draft lookup works with the target alone"
            )
        have = " and ".join(what[k] for k in folders)
        usable = [*folders, *(["hybrid"] if "model" in folders else []), "auto", "lookup"]
        raise MacspecError(
            f"--draft {source} needs {what[needs]}, but the drafter at hand is {have}: pass "
            f"--draft {usable[0]} to draft with it (or {', '.join(usable[1:])}), or "
            f"--draft-model with {what[needs]}{_EXAMPLES[needs]}"
        )
    return source


_EXAMPLES = {
    "model": " (a small model with the target's tokenizer)",
    "mtp": " (an mlx-vlm qwen3_5_mtp folder, e.g. mlx-community/Qwen3.6-27B-MTP-4bit)",
    "dflash": " (a z-lab folder, e.g. z-lab/Qwen3.5-9B-DFlash)",
    "eagle3": " (a speculators or EAGLE-3 head folder, e.g. RedHatAI/Qwen3-8B-speculator.eagle3)",
}
"""Where to get a drafter of each kind, for the error that asks for one."""


def build_engine(
    resolved: ResolvedModels,
    num_draft_tokens: str | None = None,
    no_draft: bool = False,
    draft: str | None = None,
    cache_options: CacheOptions = DEFAULT_CACHE,
    group=None,
    watchdog=None,
    draft_tree: str | None = None,
) -> tuple[Engine, LoadedModels]:
    """Load the models and build the engine.

    `num_draft_tokens` None means the pair's default; `draft` says where guesses come from:
    the draft model, prompt lookup (n-grams of the context, no second model), both ('hybrid'),
    an MTP head, a DFlash drafter, an EAGLE-3 head, or 'auto' (whichever measures fastest
    here, lookup and plain decoding included). None: the draft folder's own kind, or prompt
    lookup without one.

    With an mlx.distributed `group` (several ranks under mlx.launch) the target is sharded over
    them, the draft replicated, and the engine a `DistributedEngine` whose ranks agree on every
    decision (`watchdog`: kicked by every pass and exchange). `draft_tree`: `--draft-tree`.
    """
    if group is not None and tree_size(draft_tree) is not None:
        raise MacspecError("--draft-tree is not supported on a target split across machines yet")
    loaded, source, spec = load_for_drafting(
        resolved, num_draft_tokens, no_draft, draft, group, draft_tree
    )
    policy = make_policy(spec)
    if no_draft:
        engine = Engine(loaded.target, loaded.tokenizer, cache_options=cache_options)
    else:
        drafter = make_drafter(source, loaded, cache_options)
        if isinstance(drafter, DrafterChoice):
            policy = drafter  # it chooses the draft length per candidate, too
        policy = make_tree_policy(draft_tree, policy)
        engine = Engine(
            loaded.target, loaded.tokenizer, drafter, policy, loaded.vocab_size, cache_options
        )
    if group is not None:
        from macspec.engine.generate.distributed import DistributedEngine

        engine = DistributedEngine(engine, group, watchdog)
    return engine, loaded


def build_batch_engine(
    resolved: ResolvedModels,
    num_draft_tokens: str | None = None,
    no_draft: bool = False,
    draft: str | None = None,
    cache_options: CacheOptions = DEFAULT_CACHE,
    draft_tree: str | None = None,
) -> tuple[BatchEngine, LoadedModels]:
    """Load the models into an engine that decodes several requests together, each row with
    a drafter and a policy of its own (the same kinds `build_engine` makes; `draft_tree`:
    `--draft-tree`)."""
    loaded, source, spec = load_for_drafting(
        resolved, num_draft_tokens, no_draft, draft, draft_tree=draft_tree
    )
    source = None if no_draft else source
    return batch_engine_for(loaded, source, spec, cache_options, draft_tree), loaded


def batch_engine_for(
    loaded: LoadedModels,
    source: str | None,
    spec: str,
    cache_options: CacheOptions = DEFAULT_CACHE,
    draft_tree: str | None = None,
) -> BatchEngine:
    """A BatchEngine over loaded models whose rows draft with `source` (None: plainly), with
    trees where `draft_tree` asks for them."""
    make_policy(spec)  # checked now, not at the first request

    def new_drafter() -> Drafter:
        return make_drafter(source, loaded, cache_options)

    def new_policy(drafter: Drafter):
        policy = drafter if isinstance(drafter, DrafterChoice) else make_policy(spec)
        return make_tree_policy(draft_tree, policy)

    return BatchEngine(
        loaded.target,
        loaded.tokenizer,
        None if source is None else new_drafter,
        new_policy,
        loaded.vocab_size,
        cache_options,
    )


def load_for_drafting(
    resolved: ResolvedModels,
    num_draft_tokens: str | None,
    no_draft: bool,
    draft: str | None,
    group=None,
    draft_tree: str | None = None,
) -> tuple[LoadedModels, str, str]:
    """The flags checked, the models loaded: (models, the drafter's kind, the draft length)."""
    check_draft_flags(num_draft_tokens, no_draft, draft, draft_tree)
    check_distributed_source(draft, group)
    spec = num_draft_tokens
    if spec is None:
        spec = resolved.pair.draft_policy if resolved.pair is not None else "auto"
    check_draft_tokens(spec)
    make_policy(spec)  # validated even with --no-draft: a typo is still an error
    folders = {} if no_draft or draft in ("lookup", "suffix") else drafter_folders(resolved, draft)
    if group is not None:  # heads that read a sharded target's hidden states: not yet
        folders = {k: v for k, v in folders.items() if k not in HEAD_KINDS}
    source = choose_source(draft, folders)
    sources = set(folders) if source == "auto" else {source}
    loaded = load_drafters(resolved, folders, sources, group, more_drafts=source == "auto")
    loaded.warnings.extend(resolved.notes)
    context = resolved.pair.context_length if resolved.pair is not None else None
    text = read_config(resolved.target)
    warn_if_over_working_set(loaded, context or text.get("max_position_embeddings"))
    return loaded, source, str(spec)


def check_distributed_source(draft: str | None, group) -> None:
    """Drafters that read the target's hidden states are refused on a sharded target."""
    if group is not None and draft in HEAD_KINDS:
        raise MacspecError(
            f"--draft {draft} is not supported on a target split across machines yet; "
            "use --draft model, lookup, hybrid or auto"
        )


def warn_if_over_working_set(loaded: LoadedModels, context_length: int | None) -> None:
    """One line when the weights and a full KV cache exceed what the GPU may wire."""
    from macspec.engine.core.wired import recommended_working_set
    from macspec.models.loader import weight_bytes

    limit = recommended_working_set()
    if limit is None:
        return
    models = [loaded.target, loaded.draft, *loaded.heads.values()]
    weights = sum(weight_bytes(m) for m in models if m is not None)
    config = read_config(loaded.target_path)
    kv = (kv_cache_bytes(config, context_length) or 0) if context_length else 0
    if weights + kv > limit:
        cache = f" and a full {context_length}-token KV cache ({kv / 1e9:.1f} GB)" if kv else ""
        loaded.warnings.append(
            f"weights ({weights / 1e9:.1f} GB){cache} exceed the {limit / 1e9:.1f} GB this "
            "GPU may wire: expect paging and slow answers (a smaller pair, a shorter context "
            "or --kv-bits 8)"
        )


def load_drafters(
    resolved: ResolvedModels,
    folders: dict[str, Path],
    sources: set[str],
    group=None,
    more_drafts: bool = False,
) -> LoadedModels:
    """The target and the drafters `sources` need ('hybrid' needs the draft model); heads'
    configs are checked against the target's before any weight is loaded. With an
    mlx.distributed `group`, the target is sharded over its ranks. `more_drafts`: the pair's
    further draft models too (for `--draft auto`)."""
    wanted = {"model" if s == "hybrid" else s for s in sources}
    target_config = read_config(resolved.target)
    heads = {k: _check_head(folders[k], k, target_config) for k in HEAD_KINDS if k in wanted}
    model_path = folders.get("model") if "model" in wanted else None
    loaded = load_models(
        resolved.target, model_path, resolved.target_name, resolved.draft_name, group
    )
    for kind, load in heads.items():
        loaded.heads[kind] = load()
    if more_drafts and model_path is not None:
        for name, path in resolved.more_drafts:
            draft = load_checked_draft(loaded, path, resolved.target_name, name)
            loaded.more_drafts[name] = draft
    return loaded


def _check_head(folder: Path, kind: str, target_config: dict):
    """Check a head's config against the target's now; return how to load it later."""
    if kind == "mtp":
        if drafter_kind(folder) == "mtp-checkpoint":
            folder = converted_mtp_folder(folder)
        config = read_config(folder)
        check_mtp(folder, config, target_config)
        return lambda: load_mtp(folder, target_config)
    if kind == "eagle3":
        check_eagle3(folder, read_config(folder), target_config)
        return lambda: load_eagle3(folder, target_config)
    check_dflash(folder, read_config(folder), target_config)
    return lambda: load_dflash(folder, target_config)


def converted_mtp_folder(checkpoint: Path) -> Path:
    """An original checkpoint's mtp.* tensors as an MTP drafter folder in the macspec home
    (converted once, reused after)."""
    out = macspec_home() / "drafters" / f"{checkpoint.resolve().name}-mtp"
    if not (out / "config.json").is_file():
        try:
            convert_mtp_checkpoint(checkpoint, out)
        except OSError as exc:  # the home is a file, read-only, or full
            raise MacspecError(
                f"cannot convert {checkpoint}'s MTP head into {out}: {exc.strerror or exc} "
                "(set MACSPEC_HOME to a writable folder)"
            ) from None
    return out


def model_labels(names: list[str]) -> list[str]:
    """How `--draft auto` calls several draft models: 'model (draft-tuned)', by the last part
    of each name (a repo id's model, a folder's name), numbered should two read the same."""
    shorts = [name.rstrip("/").rpartition("/")[2].rpartition(":")[2] or name for name in names]
    return [
        f"model ({short})" if shorts.count(short) == 1 else f"model ({short} #{i + 1})"
        for i, short in enumerate(shorts)
    ]


def make_drafter(
    draft: str, loaded: LoadedModels, cache_options: CacheOptions = DEFAULT_CACHE
) -> Drafter:
    """A fresh drafter of kind `draft` over loaded models: 'model', 'lookup', 'hybrid', 'mtp',
    'dflash', 'eagle3', or 'auto' (every one of them that is loaded, chosen by measurement)."""
    if draft == "lookup":
        return LookupDrafter()
    if draft == "suffix":
        return SuffixDrafter(loaded.said)
    if draft == "mtp" and "mtp" in loaded.heads:
        return MTPDrafter(loaded.heads["mtp"], loaded.target, vocab_size=loaded.vocab_size)
    if draft == "dflash" and "dflash" in loaded.heads:
        return DFlashDrafter(loaded.heads["dflash"], loaded.target, vocab_size=loaded.vocab_size)
    if draft == "eagle3" and "eagle3" in loaded.heads:
        return Eagle3Drafter(loaded.heads["eagle3"], loaded.target, vocab_size=loaded.vocab_size)
    if draft == "auto":
        kinds = [
            k
            for k in ("model", *HEAD_KINDS)
            if k in loaded.heads or (k == "model" and loaded.draft is not None)
        ]
        candidates = [make_drafter(k, loaded, cache_options) for k in kinds]
        if loaded.more_drafts:  # several draft models: each a candidate, by its own name
            first, *heads = candidates
            models = [first] + [
                ModelDrafter(model, vocab_size=loaded.vocab_size, options=cache_options)
                for model in loaded.more_drafts.values()
            ]
            for drafter, label in zip(
                models, model_labels([loaded.draft_name, *loaded.more_drafts])
            ):
                drafter.name = label
            candidates = [*models, *heads]
        return DrafterChoice([*candidates, LookupDrafter(), SuffixDrafter(loaded.said)])
    if loaded.draft is None:
        raise MacspecError(f"--draft {draft} needs a draft model (--draft-model, or a --pair)")
    model = ModelDrafter(loaded.draft, vocab_size=loaded.vocab_size, options=cache_options)
    return HybridDrafter(model) if draft == "hybrid" else model
