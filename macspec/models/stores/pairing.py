"""Pairs among the models on this machine: a draft shares the target's tokenizer (the same
fingerprint, read from metadata: no weights, no tokenizer loaded) and is at most half its size.
Fingerprints are compared within one format (GGUF's bytes, or tokenizer.json's vocabulary)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from macspec.errors import MacspecError
from macspec.models.stores.listing import LocalModel, local_models

MAX_DRAFT_SHARE = 0.5
"""A draft at most this share of the target's size. Decoding reads every weight per step, so a
guess costs about the draft's share of a target pass: at half, k guesses cost k/2 passes, and
even all kept, a cycle of k + 1 tokens costs 1 + k/2 passes (at most 2x at any k, under 1.5x
at the usual 60-80% kept), while the next size down of a family nearly always exists. Not a
price (`-k auto` measures that per answer): only which siblings to offer, smallest first.
Qwen2.5-Coder 0.5B for 1.5B (35-44%) pairs."""


@dataclass(frozen=True)
class LocalPair:
    target: LocalModel
    draft: LocalModel

    @property
    def spec(self) -> str:
        """What `--pair` takes: `TARGET+DRAFT`."""
        return f"{self.target.name}+{self.draft.name}"

    def why(self) -> str:
        """One line: which draft, and why it was taken."""
        t, d = self.target.about, self.draft.about
        assert t is not None and d is not None
        return (
            f"draft {self.draft.name} for {self.target.name}: the same tokenizer, "
            f"{d.size_bytes / 1e9:.2f} GB against {t.size_bytes / 1e9:.2f} GB"
        )


def _key(model: LocalModel) -> tuple[str, str] | None:
    about = model.about
    if about is None or about.tokenizer is None or model.error is not None:
        return None  # unreadable, or an architecture macspec does not run: never a draft
    return about.format, about.tokenizer


def drafts_for(target: LocalModel, models: list[LocalModel]) -> list[LocalModel]:
    """The models that can draft for `target`, the smallest (fastest to guess with) first."""
    key, about = _key(target), target.about
    if key is None or about is None:
        return []
    found = [
        m
        for m in models
        if _key(m) == key
        and m.about is not None
        and m.about.size_bytes <= about.size_bytes * MAX_DRAFT_SHARE
    ]
    return sorted(found, key=lambda m: (m.about.size_bytes, m.name))  # type: ignore[union-attr]


def local_pairs(models: list[LocalModel]) -> list[LocalPair]:
    """Every target on this machine with its best draft (the smallest that fits the rule)."""
    pairs = []
    for target in models:
        drafts = drafts_for(target, models)
        if drafts:
            pairs.append(LocalPair(target, drafts[0]))
    return pairs


def source_path(name: str, resolved: Path) -> Path:
    """The file or folder a name points to as it lies in its store (not what loading derives
    from it): the store's path, else the path given, else the resolved folder (an HF id)."""
    from macspec.models import stores

    found = stores.find(name)
    if found is not None:
        return found.path
    given = Path(name).expanduser()
    return given if given.exists() else resolved


def auto_draft(target_name: str, target_path: Path) -> LocalPair:
    """`--draft-model auto`: the best draft on this machine for the target at `target_path`;
    one line when there is none."""
    from macspec.models.stores.listing import describe_path

    try:
        about = describe_path(target_path)
    except (MacspecError, OSError, ValueError) as exc:
        raise MacspecError(f"--draft-model auto: cannot read {target_name} ({exc})") from None
    from macspec.models.gguf.archs import unsupported

    why = unsupported(about.architecture or "?") if about.format == "gguf" else None
    if why is not None:  # the reason it cannot run, not that no draft was found
        raise MacspecError(f"{target_name}: {why}")
    target = LocalModel(target_name, "given", target_path, about)
    same_file = target_path.resolve()
    models = [m for m in local_models() if m.path is None or m.path.resolve() != same_file]
    drafts = drafts_for(target, models)
    if not drafts:
        raise MacspecError(
            f"--draft-model auto: no model on this Mac shares {target_name}'s tokenizer at "
            f"most half its size (see `macspec models --local`); name a draft, or leave it out"
        )
    return LocalPair(target, drafts[0])


def resolve_auto(model: str, resolved: Path) -> tuple[str, str]:
    """`--draft-model auto` for `model` (resolved to `resolved`): the draft its Ollama manifest
    names, else the best one on this machine; (a name `--draft-model` takes, the line that
    says which and why)."""
    from macspec.models import stores

    found = stores.find(model)
    if found is not None and found.draft is not None:
        return str(found.draft), f"draft for {model}: the one its manifest names"
    pair = auto_draft(model, source_path(model, resolved))
    return pair.draft.name, pair.why()
