"""What a command resolved its model names to: the folders to load and what was said of them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from macspec.models.catalog import Pair


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
            from macspec.models.stores.ollama_mlx import carried_head

            return carried_head(self.target, kind)
        from macspec.models.catalog import _pair_model_path

        return _pair_model_path(self.pair, self.pair.heads[kind])
