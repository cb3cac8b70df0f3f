"""What `macspec tune` is asked to do, what it reports while it runs, and what it found."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from macspec.tune.measure import Measurement


@dataclass(frozen=True)
class TuneConfig:
    """Everything `macspec tune` was asked to do."""

    out: Path
    """Where the tuned draft goes (an mlx-lm model folder)."""
    pair: str | None = None
    """A catalog pair; with neither pair nor model, the default pair."""
    model: str | None = None
    """The target, given directly (with `draft_model`)."""
    draft_model: str | None = None
    """The draft to tune (replaces the pair's)."""
    prompts: Path | None = None
    """A JSONL file of prompts or chat messages."""
    from_history: bool = False
    """Use the stored conversations instead."""
    held_out: Path | None = None
    """Prompts to measure on; None: a split of the prompts, never trained on."""
    held_out_fraction: float = 0.1
    """Share of the prompts held out when there is no --held-out file."""
    held_out_most: int = 50
    """At most this many held out then."""
    max_tokens: int = 256
    """Longest answer, when generating the training answers and when measuring."""
    temperature: float = 0.0
    """Temperature of the answers and of the measurements (0: greedy)."""
    k: int | None = None
    """Draft length of the measurements; None: the pair's fixed k, else 4."""
    steps: int | None = None
    """Training steps; None: about two passes over the answers (10 to 1,000)."""
    full: bool | None = None
    """Full fine-tuning (True) or LoRA (False); None: full for a draft of at most
    `FULL_FINE_TUNING_MOST` parameters, where it is cheap, LoRA above."""
    lora_rank: int = 8
    """LoRA rank."""
    batch_size: int = 8
    """Conversations per training step."""
    learning_rate: float | None = None
    """None: 2e-4 for LoRA, 5e-4 for full fine-tuning."""
    kl_weight: float = 0.0
    """Weight of KL(target top-k || draft) in the loss, against cross-entropy."""
    top_k: int = 32
    """Target log-probabilities kept per position for the KL term."""
    register: str | None = None
    """Add a pair of this name (target + tuned draft) to the user's models.toml."""
    force: bool = False
    """Replace an existing --out."""
    cache: bool = True
    """Keep the target's answers in the macspec home, and reuse the ones kept."""
    seed: int = 0
    """Seeds the held-out split, sampling, batch order and LoRA initialisation."""


@dataclass
class TuneResult:
    """What a tune run did and measured."""

    out: Path
    before: Measurement
    after: Measurement
    train_prompts: int
    held_out_prompts: int
    answer_tokens: int
    steps: int
    method: str
    trainable: int
    train_s: float
    peak_memory_bytes: int
    """MLX's peak allocation during training."""
    max_rss_bytes: int
    """The process's peak resident memory so far."""
    identical: bool | None
    """Greedy: the held-out outputs were the same with either draft (both lossless)."""
    registered: Path | None = None
    notes: list[str] = field(default_factory=list)
    draft_parameters: int = 0
    """The draft's parameters, unquantized: what the method is chosen by when not told."""

    @property
    def change(self) -> tuple[float, float | None]:
        """(mean, standard error) over the held-out prompts of the change in each prompt's
        tokens per target pass, after minus before (paired: the same prompts, the same
        greedy answers); the error is None with fewer than two prompts (no spread)."""
        pairs = zip(self.before.prompt_rates(), self.after.prompt_rates())
        diffs = [after - before for before, after in pairs]
        if len(diffs) < 2:
            return (diffs[0] if diffs else 0.0), None
        mean = sum(diffs) / len(diffs)
        variance = sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1)
        return mean, (variance / len(diffs)) ** 0.5

    @property
    def verdict(self) -> str:
        """'better' or 'worse' when the paired change clears two standard errors (a gain that
        would show on other prompts too), else 'unclear'."""
        mean, error = self.change
        if error is None or abs(mean) <= 2 * error or mean == 0:  # one prompt tells nothing
            return "unclear"
        return "better" if mean > 0 else "worse"

    @property
    def better(self) -> bool:
        return self.verdict == "better"


class Reporter(Protocol):
    """Where progress goes (the CLI renders it; tests may interrupt from it)."""

    def note(self, text: str) -> None:
        """One line of information."""

    def task(self, description: str, total: int) -> AbstractContextManager[Callable[[], None]]:
        """A progress bar of `total` steps; the context yields the function that advances it."""

    def train_report(self, info: dict) -> None:
        """mlx-lm's training report (iteration, train_loss, tokens_per_second, ...)."""


class QuietReporter:
    def note(self, text: str) -> None:
        pass

    def task(self, description: str, total: int) -> AbstractContextManager[Callable[[], None]]:
        return nullcontext(lambda: None)

    def train_report(self, info: dict) -> None:
        pass
