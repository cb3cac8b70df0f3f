"""A thinking budget (Anthropic's `thinking.budget_tokens`): once the reasoning has taken that
many tokens, it is closed and the answer follows.

The generation is stopped after the token that spends the budget (the caches keep exactly the
ids delivered); a second generation then continues from the prompt, those ids and the ids that
close the block (`\\n</think>\\n\\n`), so only the closing ids are prefilled. The client sees
one answer: the closing text as one more token, and one Done whose counts cover both parts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from macspec.engine.core.events import Done, Event, Prefill, Source, Token
from macspec.engine.core.stats import Stats
from macspec.engine.generate.loop import GenerationConfig
from macspec.models.reasoning import CLOSE, ReasoningSplitter

CLOSING = f"\n{CLOSE}\n\n"
"""What ends a reasoning block, as the chat templates write an empty one."""


@dataclass(frozen=True)
class ThinkingBudget:
    """At most `tokens` tokens of reasoning; `inside`: the prompt opened the block."""

    tokens: int
    inside: bool = False


def budgeted(
    generate: Callable[[list[int], GenerationConfig, Callable[[], bool]], Iterator[Event]],
    encode: Callable[[str], list[int]],
    prompt: list[int],
    config: GenerationConfig,
    budget: ThinkingBudget,
    cancelled: Callable[[], bool],
) -> Iterator[Event]:
    """The events of a generation whose reasoning stops at the budget (see the module)."""
    splitter = ReasoningSplitter(budget.inside)
    spent = 0

    def over_budget() -> bool:
        return cancelled() or (splitter.in_reasoning and spent >= budget.tokens)

    first: Done | None = None
    for event in generate(prompt, config, over_budget):
        if isinstance(event, Token):
            spent += splitter.in_reasoning
            splitter.feed(event.text)
        if isinstance(event, Done):
            first = event
            break
        yield event
    assert first is not None
    if first.finish_reason != "cancelled" or cancelled() or not splitter.in_reasoning:
        yield first
        return
    closing = encode(CLOSING)
    room = config.max_tokens - len(first.tokens) - len(closing)
    if room < 1:
        yield first
        return
    yield Token(closing[-1], first.tail + CLOSING, Source.TARGET)
    rest = replace(config, max_tokens=room)
    for event in generate(prompt + first.tokens + closing, rest, cancelled):
        if isinstance(event, Prefill):
            continue  # the client was told how the prompt was prefilled already
        if isinstance(event, Done):
            yield joined(first, closing, event)
            return
        yield event


def joined(first: Done, closing: list[int], second: Done) -> Done:
    """One Done for a generation made of two: the counts of both, the closing ids between."""
    a, b = first.stats, second.stats
    stats = Stats(
        prompt_tokens=a.prompt_tokens,
        prefilled_tokens=a.prefilled_tokens,
        disk_tokens=a.disk_tokens,
        disk_written_bytes=a.disk_written_bytes + b.disk_written_bytes,
        disk_written_tokens=a.disk_written_tokens,
        generated_tokens=a.generated_tokens + len(closing) + b.generated_tokens,
        steady_tokens=a.steady_tokens + len(closing) + b.generated_tokens,
        end_tokens=b.end_tokens,
        target_passes=a.target_passes + b.target_passes,
        draft_proposed=a.draft_proposed + b.draft_proposed,
        draft_accepted=a.draft_accepted + b.draft_accepted,
        target_fed_tokens=a.target_fed_tokens + b.target_fed_tokens,
        batch_rows=a.batch_rows + b.batch_rows,
        refed_tokens=a.refed_tokens + b.refed_tokens,
        tree_cycles=a.tree_cycles + b.tree_cycles,
        tree_nodes=a.tree_nodes + b.tree_nodes,
        tree_note=b.tree_note or a.tree_note,
        sampler=a.sampler,
        drafter_choice=b.drafter_choice or a.drafter_choice,
        ttft_s=a.ttft_s,
        decode_s=a.decode_s + b.elapsed_s,
        elapsed_s=a.elapsed_s + b.elapsed_s,
        prefill_s=a.prefill_s,
        draft_s=a.draft_s + b.draft_s,
        verify_s=a.verify_s + b.verify_s,
    )
    for part in (a, b):
        for name, (proposed, accepted) in part.by_source.items():
            counts = stats.by_source.setdefault(name, [0, 0])
            counts[0] += proposed
            counts[1] += accepted
    histogram = [x + y for x, y in zip(a.accepted_histogram, b.accepted_histogram)]
    longer = max(a.accepted_histogram, b.accepted_histogram, key=len)
    stats.accepted_histogram = histogram + longer[len(histogram) :]
    return Done(
        finish_reason=second.finish_reason,
        text=first.text + CLOSING + second.text,
        tail=second.tail,
        tokens=first.tokens + closing + second.tokens,
        sources=first.sources + [Source.TARGET] * len(closing) + second.sources,
        stats=stats,
        stop_string=second.stop_string,
    )
