"""What `macspec tune` is asked to do, what it reports while it runs, and what it found."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from macspec.errors import MacspecError

if TYPE_CHECKING:
    from macspec.tune.loop import Check, Step, TrainRecord
    from macspec.tune.measure import Measurement


DEFAULT_TIME_BUDGET_S = 600.0
"""Ten minutes: the demo draft's held-out loss was still falling after that on a CPU, but
a user waiting on a first run should see a result; --time-budget gives more."""

_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)(s?))?")


def parse_duration(text: str, option: str = "--time-budget") -> float:
    """Seconds of '90', '90s', '10m', '1.5h', '1h30m', or '1h30' (a unitless number after hours
    is minutes, as a clock reads it; after minutes, seconds); anything else, or zero, is the
    user's error."""
    match = _DURATION.fullmatch(text.strip().lower())
    if not text.strip() or match is None:
        raise MacspecError(
            f"{option} must be a duration such as 90s, 10m, 1h or 1h30m, got {text!r}"
        )
    hours, minutes, seconds = (float(part or 0) for part in match.groups()[:3])
    if match[1] and not match[2] and match[3] and not match[4]:  # '1h30': 1 h 30 min
        minutes, seconds = seconds, 0.0
    total = hours * 3600 + minutes * 60 + seconds
    if not 0 < total < math.inf:
        raise MacspecError(f"{option} must be longer than 0 s, got {text!r}")
    return total


FLOOR_LEAST, FLOOR_MOST = 10, 1000
"""The bounds of the step before which the held-out loss stops nothing."""


def held_out_floor(examples: int, batch_size: int, cap: int | None) -> tuple[int, str]:
    """The step before which the held-out loss stops nothing, and why that one: two passes
    over the answers (tune's fixed length before it had a held-out loss: the stock demo
    draft's rose for 30 steps, then fell), but at least FLOOR_LEAST steps and at most
    FLOOR_MOST, and never past --steps."""
    passes = math.ceil(2 * examples / min(batch_size, examples))
    floor = min(FLOOR_MOST, max(FLOOR_LEAST, passes))
    if cap is not None and cap < floor:
        return cap, "--steps"
    if passes < FLOOR_LEAST:
        return (
            floor,
            f"at least {FLOOR_LEAST} steps, though two passes over the answers take {passes}",
        )
    if passes > FLOOR_MOST:
        return (
            floor,
            f"at most {FLOOR_MOST} steps, though two passes over the answers take {passes}",
        )
    return floor, "two passes over the answers"


def format_duration(seconds: float) -> str:
    """'10 min', '1 h 30 min', '1 min 30 s', '45 s'."""
    minutes, rest = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    parts = [(hours, "h"), (minutes, "min"), (rest, "s")]
    return " ".join(f"{n} {unit}" for n, unit in parts if n) or "0 s"


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
    """At most this many training steps; None: no cap (the budget and the held-out loss stop it)."""
    time_budget_s: float = DEFAULT_TIME_BUDGET_S
    """Training stops once this long has passed (its checks of the held-out loss included)."""
    eval_every: int | None = None
    """Steps between checks of the held-out loss; None: by the held-out set's size."""
    patience: int = 5
    """Training stops after this many checks in a row without a better held-out loss."""
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
    """Optimizer steps taken."""
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
    training: TrainRecord | None = None
    """The loss curve, where training stopped and why, and the step whose weights were kept."""
    time_budget_s: float = DEFAULT_TIME_BUDGET_S

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

    def training(
        self, budget_s: float, max_steps: int | None
    ) -> AbstractContextManager[Callable[[Step | Check], None]]:
        """The training display; the context yields the function each training event (a step
        done, a check of the held-out loss) goes to."""


class QuietReporter:
    def note(self, text: str) -> None:
        pass

    def task(self, description: str, total: int) -> AbstractContextManager[Callable[[], None]]:
        return nullcontext(lambda: None)

    def training(
        self, budget_s: float, max_steps: int | None
    ) -> AbstractContextManager[Callable[[Step | Check], None]]:
        return nullcontext(lambda event: None)
