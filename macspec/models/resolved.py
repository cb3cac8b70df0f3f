"""What a command resolved its model names to: the folders to load and what was said of them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from macspec.errors import MacspecError
from macspec.models import hub
from macspec.models.stores.ollama_entry import DRAFT_CONFIG, tensor_entry
from macspec.models.stores.ollama_mtp import MTP_CONFIG


@dataclass(frozen=True)
class Pair:
    """One target model and the small draft model that guesses for it."""

    name: str
    """Short name used on the command line (`macspec pull NAME`): lowercase, no slash."""
    target: str
    """The big model: a Hugging Face repo id, a local folder, or `package:demo/target`."""
    draft: str | None
    """The small model sharing the target's tokenizer, in the same forms as `target`; None for
    a target with no small sibling (guesses then come from prompt lookup). With several (`draft
    = [...]` in models.toml), the first: the one `--draft model` drafts with."""
    draft_policy: str | int
    """Recommended draft-length policy: "auto" (adaptive) or a fixed number of draft tokens."""
    context_length: int
    """The context window (tokens) the pair is meant to serve; memory estimates assume it full."""
    description: str
    """One line for `macspec models`."""
    size_gb: float
    """Approximate download size of target plus draft, in GB (10**9 bytes)."""
    mtp: str | None = None
    """An MTP head for the target (a drafter folder in mlx-vlm's qwen3_5_mtp format), if any."""
    dflash: str | None = None
    """A DFlash block drafter for the target (z-lab's format), if any."""
    eagle3: str | None = None
    """An EAGLE-3 head for the target (speculators or EAGLE / SpecForge format), if any."""
    unsupported: tuple[str, ...] = ()
    """Drafters published for the target that macspec does not serve, each 'KIND REPO: why':
    listed by `macspec models`, never downloaded or loaded."""
    ranks: int = 1
    """Machines the target is meant to be sharded over (mlx.distributed ranks, `mlx.launch`);
    1: one machine. The drafters are replicated on every rank."""
    more_drafts: tuple[str, ...] = ()
    """Further draft models after `draft`, which `--draft auto` measures against it (one may
    suit sampling, another greedy decoding)."""
    gguf_layout: str = "compact"
    """How GGUF files of the pair are held: "compact" (near the file's bytes) or "exact"."""

    @property
    def members(self) -> tuple[str, ...]:
        """The models to download: the target, then whichever drafters the pair has."""
        drafters = (self.draft, *self.more_drafts, self.mtp, self.dflash, self.eagle3)
        return tuple(m for m in (self.target, *drafters) if m is not None)

    @property
    def heads(self) -> dict[str, str]:
        """Drafters that read the target, by kind ('mtp', 'dflash', 'eagle3')."""
        heads = (("mtp", self.mtp), ("dflash", self.dflash), ("eagle3", self.eagle3))
        return {k: v for k, v in heads if v is not None}

    @property
    def is_packaged(self) -> bool:
        """True when its models ship inside the macspec package (always "downloaded")."""
        return all(hub.is_package_spec(m) for m in self.members)


@dataclass(frozen=True)
class ResolvedModels:
    """What to load, after `--pair` / `--model` / `--draft-model` and the default pair."""

    target: Path
    """Local folder of the target model."""
    draft: Path | None
    """Local folder of the draft model; None for plain (target-only) decoding."""
    target_name: str
    """The target as the user or catalog named it (repo id, folder or package spec)."""
    draft_name: str | None
    """The draft as named, or None without a draft."""
    pair: Pair | None
    """The catalog pair used, or None when models were given directly with `--model`."""
    more_drafts: tuple[tuple[str, Path], ...] = ()
    """The pair's further draft models (name, folder), for `--draft auto`; none when
    `--draft-model` replaced the pair's drafts."""
    notes: tuple[str, ...] = ()
    """What a store said of the models that is not used (a vision projector, say): warnings."""
    store_params: dict = field(default_factory=dict)
    """The target's Ollama `params` layer (stop, temperature, ...): defaults flags override."""
    draft_choice: str | None = None
    """With `--draft-model auto`: one line saying which draft was picked, and why."""

    @property
    def draft_chosen_for_you(self) -> bool:
        """Whether macspec chose the draft (a catalog pair, `--draft-model auto`) rather than
        the user naming it: a price note about it is then not the user's to act on."""
        return self.draft is not None and (self.pair is not None or self.draft_choice is not None)

    def head(self, kind: str) -> Path | None:
        """The pair's drafter of `kind` ('mtp', 'dflash', 'eagle3') on disk, else the one the
        target's Ollama manifest carries; None when it has none."""
        if self.pair is None or kind not in self.pair.heads:
            return carried_head(self.target, kind)
        return pair_model_path(self.pair, self.pair.heads[kind])


def pair_model_path(pair: Pair, name: str) -> Path:
    """A pair member's folder; when missing, the error names `macspec pull PAIR`."""
    try:
        return hub.local_model_path(name)
    except hub.NotDownloadedError:
        raise MacspecError(
            f"pair '{pair.name}' is not downloaded ({name} missing); run: macspec pull {pair.name}"
        ) from None


def carried_head(folder: Path, kind: str) -> Path | None:
    """The drafter of `kind` ('dflash', 'mtp', ...) a folder derived from an Ollama MLX
    manifest carries (x/create/draft.go: `draft.` tensors and draft/config.json; or the
    target's own `mtp.*` tensors), or a GGUF file's MTP layer; None without one."""
    if tensor_entry(folder) is None:
        from macspec.models.gguf.mtp import gguf_mtp_head

        return gguf_mtp_head(folder) if kind == "mtp" else None
    from macspec.models.drafters import drafter_kind

    for config in (DRAFT_CONFIG, MTP_CONFIG):
        head = folder / Path(config).parent
        if tensor_entry(head) is not None and drafter_kind(head) == kind:
            return head
    return None
