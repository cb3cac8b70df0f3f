"""Acceptance and tokens per target pass of a draft on held-out prompts, at a fixed k."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import mlx.nn as nn

from macspec.engine.core.events import Cycle, Done, Token
from macspec.engine.core.sampling import SamplingParams
from macspec.engine.drafters.model import ModelDrafter
from macspec.engine.generate.loop import Engine, GenerationConfig
from macspec.engine.policy.length import FixedPolicy


@dataclass
class Measurement:
    """Counts summed over the held-out prompts (rates derived, as in the engine's Stats)."""

    k: int
    """Draft length of every cycle."""
    proposed: int = 0
    """Guesses sent to the target."""
    accepted: int = 0
    """Guesses kept."""
    kept_ends: int = 0
    """Of those, guesses of the answer's end: each is kept like any guess but saves no target
    pass, since the target's own token after it is dropped (nothing follows an end). Two
    drafts keeping as many guesses may so take different numbers of passes."""
    outputs: list[list[int]] = field(default_factory=list)
    """Each prompt's generated ids (the same for every draft at temperature 0)."""
    per_prompt: list[tuple[int, int]] = field(default_factory=list)
    """Each prompt's (tokens generated, target passes), for a paired comparison of drafts."""

    @property
    def acceptance(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def prompts(self) -> int:
        """Prompts answered."""
        return len(self.per_prompt)

    @property
    def generated(self) -> int:
        """Tokens generated."""
        return sum(tokens for tokens, _ in self.per_prompt)

    @property
    def passes(self) -> int:
        """Target passes after prefill."""
        return sum(passes for _, passes in self.per_prompt)

    @property
    def tokens_per_pass(self) -> float:
        return self.generated / self.passes if self.passes else 0.0

    def prompt_rates(self) -> list[float]:
        """Tokens per target pass of each prompt."""
        return [tokens / passes if passes else 0.0 for tokens, passes in self.per_prompt]

    def to_dict(self) -> dict:
        return {
            "k": self.k,
            "prompts": self.prompts,
            "acceptance": self.acceptance,
            "tokens_per_pass": self.tokens_per_pass,
            "proposed": self.proposed,
            "accepted": self.accepted,
            "kept_ends": self.kept_ends,
            "generated": self.generated,
            "target_passes": self.passes,
        }


def measure(
    target: nn.Module,
    tokenizer,
    draft: nn.Module,
    prompts: Sequence[list[int]],
    k: int,
    max_tokens: int,
    temperature: float = 0.0,
    seed: int = 0,
    vocab_size: int | None = None,
    advance: Callable[[], None] | None = None,
) -> Measurement:
    """Speculative decoding of every prompt with `draft` guessing k tokens a cycle (sampled
    runs seeded seed, seed + 1, ... so two drafts see the same draws)."""
    result = Measurement(k=k)
    for i, prompt in enumerate(prompts):
        # A fresh engine per prompt, as scripts/demo_figures.py: no cache carried over.
        drafter = ModelDrafter(draft, vocab_size=vocab_size)
        engine = Engine(target, tokenizer, drafter, FixedPolicy(k), vocab_size=vocab_size)
        config = GenerationConfig(
            max_tokens=max_tokens,
            sampling=SamplingParams(temperature=temperature),
            seed=seed + i if temperature > 0 else None,
        )
        last_cycle, delivered = None, 0  # the last cycle, and the tokens it delivered
        for event in engine.generate(prompt, config):
            if isinstance(event, Cycle):
                last_cycle, delivered = event, 0
            elif isinstance(event, Token):
                delivered += 1
            elif isinstance(event, Done):
                done = event
        stats = done.stats
        result.proposed += stats.draft_proposed
        result.accepted += stats.draft_accepted
        # An end the target chose itself follows the n guesses it kept; a kept guess of the
        # end is the n-th, and only n - 1 tokens come before it.
        ended = done.finish_reason == "stop" and last_cycle is not None
        result.kept_ends += ended and last_cycle.accepted > 0 and delivered < last_cycle.accepted
        result.outputs.append(list(done.tokens))
        result.per_prompt.append((stats.generated_tokens, stats.target_passes))
        if advance is not None:
            advance()
    return result
