"""What `macspec bench` runs: its settings, the configurations they ask for, and the order
in which runs interleave (prompt by prompt, configurations in rotating order). Nothing here
loads a model."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from macspec.bench.figures import MACSPEC, MLX_LM, BenchConfig
from macspec.engine.core.config import DEFAULT_CACHE, CacheOptions
from macspec.errors import MacspecError
from macspec.models.flags import check_draft_source


@dataclass(frozen=True)
class BenchSettings:
    """What to run."""

    max_tokens: int = 128
    """Most ids per generation (every tool also stops at end of sequence)."""
    temperature: float = 0.7
    """The sampling temperature; every configuration also runs greedy (T=0)."""
    top_p: float = 1.0
    """Nucleus mass for the sampled runs (1 = off)."""
    ks: tuple[int, ...] = (2, 3, 4)
    """Fixed draft lengths to run, for macspec and mlx-lm alike."""
    auto: bool = True
    """Also run macspec with the adaptive draft length, a fresh policy per run."""
    auto_warm: bool = True
    """And with one adaptive policy kept across runs (what a chat session's engine learns)."""
    repeats: int = 1
    """Passes over the whole prompt set."""
    seed: int = 0
    """Seeds of the sampled runs derive from it (the same per prompt for every tool)."""
    curve_max_m: int = 16
    """The verify-cost curve times target passes over m = 1 .. curve_max_m ids."""
    curve_repeats: int = 7
    """Fewest timings per m (one is taken before each prompt; more at the end if short);
    the curve keeps their median."""
    warmup: bool = True
    """Run every configuration once, untimed, on a few ids before measuring."""
    draft_source: str = "model"
    """Where macspec's guesses come from ('model', 'lookup', 'hybrid', 'mtp', 'dflash', 'eagle3');
    mlx-lm's are always its draft model's. The cost curve times a draft step and a lookup."""
    context_length: int | None = None
    """The target's context window: every tool stops there (macspec says 'context'), so
    their outputs stay comparable. None: no limit."""
    cache_options: CacheOptions = DEFAULT_CACHE
    """KV cache quantization and size, for macspec and mlx-lm alike."""
    more_sources: tuple[str, ...] = ()
    """Other drafters macspec also runs, at the same k and auto, side by side."""
    ranks: int = 1
    """Ranks the target is sharded over (mlx.launch). Above 1, macspec's rows only: mlx-lm's
    decoding cannot run on a sharded target; macspec plain is the baseline."""
    trees: tuple[str, ...] = ()
    """Draft-tree sizes (`--draft-tree`) macspec also runs, beside the chains: a tree of at
    most N nodes at each k, and 'auto' beside the adaptive chains."""

    def __post_init__(self) -> None:
        if self.max_tokens < 2:
            raise MacspecError(f"--max-tokens must be >= 2 for a benchmark, got {self.max_tokens}")
        if self.repeats < 1:
            raise MacspecError(f"--repeats must be >= 1, got {self.repeats}")
        if not 0 < self.temperature < math.inf:
            raise MacspecError(
                f"--temp is the sampling temperature and must be a finite number > 0 (T=0 "
                "always runs), "
                f"got {self.temperature}"
            )
        if not self.ks or any(k < 1 for k in self.ks):
            raise MacspecError(f"--k needs positive draft lengths, got {list(self.ks)}")
        for source in (self.draft_source, *self.more_sources):
            check_draft_source(source)
            if source == "auto":
                raise MacspecError(
                    "--draft auto is not a bench source: the bench measures each drafter "
                    "apart; list them (--draft model,lookup) or pass --draft all"
                )
        if self.curve_max_m < max(self.ks) + 1:
            raise MacspecError("the cost curve must reach k + 1 ids for every k")


def plan_configs(settings: BenchSettings, mlx_lm_speculates: bool = True) -> list[BenchConfig]:
    """The configurations, greedy first: plain (both tools), mlx-lm at each k, macspec too.

    mlx-lm's speculative rows are left out where it refuses to speculate (a target or draft
    whose cache it cannot trim: hybrid, recurrent, a sliding window), and all of them on a
    target sharded over several ranks.
    """
    configs = []
    mlx_lm = settings.ranks == 1
    for temp in (0.0, settings.temperature):
        configs.append(BenchConfig(MACSPEC, None, temp))
        if mlx_lm:
            configs.append(BenchConfig(MLX_LM, None, temp))
        if mlx_lm and mlx_lm_speculates:
            configs += [BenchConfig(MLX_LM, str(k), temp) for k in settings.ks]
        configs += [BenchConfig(MACSPEC, str(k), temp) for k in settings.ks]
        # Trees beside the chains (one machine: ranks would have to agree on auto's sizes too).
        sizes = [size for size in settings.trees if size != "auto" and settings.ranks == 1]
        configs += [BenchConfig(MACSPEC, str(k), temp, tree=t) for k in settings.ks for t in sizes]
        if settings.auto:
            configs.append(BenchConfig(MACSPEC, "auto", temp))
            if "auto" in settings.trees and settings.ranks == 1:
                configs.append(BenchConfig(MACSPEC, "auto", temp, tree="auto"))
        if settings.auto_warm:
            configs.append(BenchConfig(MACSPEC, "auto-warm", temp))
        for source in settings.more_sources:  # every other drafter, side by side
            configs += [BenchConfig(MACSPEC, str(k), temp, source) for k in settings.ks]
            if settings.auto:
                configs.append(BenchConfig(MACSPEC, "auto", temp, source))
        if temp > 0:  # the rejection rule beside the coupled one: acceptance compared
            configs += [
                BenchConfig(MACSPEC, str(k), temp, sampler="rejection") for k in settings.ks
            ]
    return configs


def schedule(
    configs: Sequence[BenchConfig], prompts: int, repeats: int
) -> list[tuple[int, int, BenchConfig]]:
    """(repeat, prompt, config) in run order: prompt by prompt, the configurations rotated
    by one place at each prompt so none always runs first (on a cold cache) or last."""
    order = []
    for repeat in range(repeats):
        for prompt in range(prompts):
            shift = (repeat * prompts + prompt) % len(configs)
            order += [(repeat, prompt, c) for c in [*configs[shift:], *configs[:shift]]]
    return order


def run_seed(settings: BenchSettings, prompt: int, repeat: int) -> int:
    return settings.seed + 1000 * repeat + prompt
