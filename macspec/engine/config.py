"""What to generate and when to stop: the engine's GenerationConfig."""

from __future__ import annotations

from dataclasses import dataclass, replace

from macspec.engine.sampling import SamplingParams
from macspec.errors import MacspecError


@dataclass(frozen=True)
class GenerationConfig:
    """What to generate and when to stop."""

    max_tokens: int = 256
    """Most tokens to generate."""
    sampling: SamplingParams = SamplingParams()
    """Temperature and filters; the default is greedy."""
    stop_strings: tuple[str, ...] = ()
    """Text that ends the answer when it appears (it is not shown)."""
    seed: int | None = None
    """Seed for sampled runs; None draws a fresh one."""
    context_length: int | None = None
    """Tokens the model can attend to, prompt included; the answer stops there (finish
    reason 'context') and a prompt that fills it is refused. None: no limit."""
    prefill_step_size: int = 2048
    """Prompt ids per prefill pass (mlx-lm's --prefill-step-size)."""
    sampler: str | None = None
    """Sampled runs: 'coupled' (output identical to plain decoding with the seed, whatever
    drafts) or 'rejection' (the most guesses kept); None: coupled with a seed, else rejection."""

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise MacspecError(f"--max-tokens must be >= 1, got {self.max_tokens}")
        if self.prefill_step_size < 1:
            raise MacspecError(f"--prefill-step-size must be >= 1, got {self.prefill_step_size}")

    def within_context(self, prompt_tokens: int) -> tuple[GenerationConfig, bool]:
        """This config for a prompt of `prompt_tokens`: max_tokens cut to the room the context
        window leaves, and whether the window (not max_tokens) bounds the answer. A prompt
        that fills the window is refused."""
        if self.context_length is None:
            return self, False
        room = self.context_length - prompt_tokens
        if room < 1:
            raise MacspecError(
                f"the prompt is {prompt_tokens} tokens and the model's context holds "
                f"{self.context_length}; shorten it"
            )
        if room < self.max_tokens:
            return replace(self, max_tokens=room), True
        return self, False  # max_tokens comes first
