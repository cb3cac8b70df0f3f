"""Counters of a generation and the figures derived from them. The engine only counts."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from macspec.engine.core.cycle import Cycle


@dataclass
class Stats:
    """Counts for one generation; rates are derived, never stored."""

    prompt_tokens: int = 0
    """Ids in the prompt."""
    prefilled_tokens: int = 0
    """Prompt ids the target actually processed (fewer when a cached prefix was reused)."""
    disk_tokens: int = 0
    """Of the prompt ids not prefilled, those a prompt cache loaded from disk for this
    generation (set by macspec/prefix, not the engine)."""
    disk_written_bytes: int = 0
    """Bytes of new prompt-cache blocks this generation's prefill wrote to disk."""
    disk_written_tokens: int = 0
    """Prompt ids this generation prefilled into the target's new prompt-cache blocks (set by
    macspec/prefix): what a later prompt sharing them reads instead of prefilling."""
    generated_tokens: int = 0
    """Ids delivered to the caller (EOS excluded)."""
    end_tokens: int = 0
    """1 when the target chose end of sequence: not delivered, but decided like any token."""
    target_passes: int = 0
    """Target forward passes after prefill: one per cycle."""
    draft_proposed: int = 0
    """Guesses a drafter sent to the target for verification (a grammar's forced ids apart)."""
    forced_tokens: int = 0
    """Ids a grammar forced (the only ones its mask allowed), verified like guesses but
    drafted by nobody: counted here, never as guesses."""
    draft_accepted: int = 0
    """Guesses the target kept."""
    by_source: dict[str, list[int]] = field(default_factory=dict)
    """Per drafter kind ('model', 'lookup'): [proposed, accepted]."""
    target_fed_tokens: int = 0
    """Ids the target processed in its passes after prefill (verify passes and plain steps)."""
    refed_tokens: int = 0
    """Of those, ids fed again after a checkpoint was restored (recurrent caches)."""
    batch_rows: int = 0
    """Requests sharing each target pass, summed over the passes (batched decoding)."""
    sampler: str | None = None
    """How a sampled run chose its tokens: 'coupled' or 'rejection'; None when greedy."""
    drafter_choice: str | None = None
    """With --draft auto: the drafter picked last, and the measured rates it was picked by."""
    plain_reason: str | None = None
    """Why a run with a drafter guessed nothing at all, in words; None otherwise."""
    price_note: str | None = None
    """What the draft length's cost model measured, in words, when it says speculation loses
    here (a draft too slow for what it gets kept); None otherwise. Callers decide whether to
    show it (not for a pair macspec chose itself)."""
    tree_cycles: int = 0
    """Cycles that verified a draft tree (`--draft-tree`); their nodes count as proposed."""
    tree_nodes: int = 0
    """Tree nodes those cycles verified."""
    tree_note: str | None = None
    """Why a run asked for trees verified chains (a target or drafter that cannot), in words."""
    accepted_histogram: list[int] = field(default_factory=list)
    """accepted_histogram[n]: cycles that proposed something and kept exactly n guesses."""
    ttft_s: float = 0.0
    """Seconds from the start to the first token (prefill included)."""
    decode_s: float = 0.0
    """Seconds from the first token to the last."""
    steady_tokens: int = 0
    """Generated tokens from passes after the one that brought the first token."""
    elapsed_s: float = 0.0
    """Seconds for the whole generation."""
    prefill_s: float = 0.0
    """Seconds spent prefilling the prompt."""
    draft_s: float = 0.0
    """Seconds spent drafting, in the cycles that time drafting apart only: probe cycles of a
    priced draft length (`-k auto`: the first two and every 32nd). Other cycles wait on the
    device once for draft and verdict together, so their drafting is inside verify_s; with a
    fixed -k this stays 0."""
    verify_s: float = 0.0
    """Seconds of the target's passes after prefill, with the drafting of cycles not timed
    apart, summed over every cycle including the one that brought the first token: it can
    exceed decode_s, which starts at the first token."""

    def add_cycle(self, cycle: Cycle) -> None:
        self.target_passes += 1
        self.batch_rows += cycle.rows
        self.target_fed_tokens += cycle.fed
        self.refed_tokens += cycle.refed
        self.draft_s += cycle.draft_s
        self.verify_s += cycle.verify_s
        if cycle.proposed and cycle.draft_source == "grammar":
            self.forced_tokens += cycle.accepted  # the mask allows nothing else: all kept
        elif cycle.proposed:
            self.draft_proposed += cycle.proposed
            self.draft_accepted += cycle.accepted
            counts = self.by_source.setdefault(cycle.draft_source or "model", [0, 0])
            counts[0] += cycle.proposed
            counts[1] += cycle.accepted
            if cycle.tree is not None:
                self.tree_cycles += 1
                self.tree_nodes += cycle.tree.nodes
            missing = cycle.accepted + 1 - len(self.accepted_histogram)
            self.accepted_histogram.extend([0] * max(0, missing))
            self.accepted_histogram[cycle.accepted] += 1

    @property
    def cached_tokens(self) -> int:
        """Prompt ids that came from a cache (memory or disk) rather than a prefill."""
        return max(0, self.prompt_tokens - self.prefilled_tokens) if self.prefilled_tokens else 0

    @property
    def acceptance_rate(self) -> float | None:
        """Share of guesses the target kept; None when nothing was proposed."""
        return self.draft_accepted / self.draft_proposed if self.draft_proposed else None

    @property
    def tokens_per_pass(self) -> float | None:
        """Ids the target decided per pass (the end of sequence it chose included, since it
        costs a pass like any other): 1.00 plain, up to k + 1 with a perfect draft."""
        decided = self.generated_tokens + self.end_tokens
        return decided / self.target_passes if self.target_passes else None

    @property
    def rows_per_pass(self) -> float | None:
        """Requests that shared a target pass, on average (1.00 unbatched)."""
        return self.batch_rows / self.target_passes if self.target_passes else None

    @property
    def decode_tokens_per_s(self) -> float | None:
        """Tokens after the first pass's over the time after the first token: the steady
        decode rate (None when every token came with the first: no rate to speak of)."""
        if self.steady_tokens < 1 or self.decode_s <= 0:
            return None
        return self.steady_tokens / self.decode_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "prefilled_tokens": self.prefilled_tokens,
            "cached_tokens": self.cached_tokens,
            "disk_tokens": self.disk_tokens,
            "disk_written_bytes": self.disk_written_bytes,
            "disk_written_tokens": self.disk_written_tokens,
            "generated_tokens": self.generated_tokens,
            "end_tokens": self.end_tokens,
            "target_passes": self.target_passes,
            "draft_proposed": self.draft_proposed,
            "draft_accepted": self.draft_accepted,
            "forced_tokens": self.forced_tokens,
            "acceptance_rate": self.acceptance_rate,
            "tokens_per_pass": self.tokens_per_pass,
            "accepted_histogram": list(self.accepted_histogram),
            "target_fed_tokens": self.target_fed_tokens,
            "refed_tokens": self.refed_tokens,
            "rows_per_pass": self.rows_per_pass,
            "tree_cycles": self.tree_cycles,
            "tree_nodes": self.tree_nodes,
            "tree_nodes_per_cycle": (
                self.tree_nodes / self.tree_cycles if self.tree_cycles else None
            ),
            "tree_note": self.tree_note,
            "drafter_choice": self.drafter_choice,
            "plain_reason": self.plain_reason,
            "price_note": self.price_note,
            "sampler": self.sampler,
            "by_source": {
                name: {"proposed": p, "accepted": a, "acceptance_rate": a / p if p else None}
                for name, (p, a) in self.by_source.items()
            },
            "ttft_s": self.ttft_s,
            "decode_tokens_per_s": self.decode_tokens_per_s,
            "elapsed_s": self.elapsed_s,
            "prefill_s": self.prefill_s,
            "decode_s": self.decode_s,
            "draft_s": self.draft_s,
            "verify_s": self.verify_s,
        }


def sources_line(by_source: dict[str, list[int]]) -> str | None:
    """'lookup 71% of 120, model 40% of 80': acceptance per source of guesses, when guesses
    came from anything but a draft model alone (None then: the overall figure says it all)."""
    if not by_source or set(by_source) == {"model"}:
        return None
    return ", ".join(
        f"{name} {accepted / proposed:.0%} of {proposed}"
        for name, (proposed, accepted) in sorted(by_source.items())
        if proposed
    )


def acceptance_text(accepted: int, proposed: int) -> str:
    """'acceptance 88% of 8 guesses': the share kept, and how many it is a share of."""
    guesses = "guess" if proposed == 1 else "guesses"
    return f"acceptance {accepted / proposed:.0%} of {proposed} {guesses}"


def token_count(n: int) -> str:
    """'1 token', '12 tokens'."""
    return f"{n} token{'' if n == 1 else 's'}"


def tree_text(stats: Stats) -> str | None:
    """How the draft trees went (`--draft-tree`), or why chains were verified; None: no trees
    were asked for."""
    if stats.tree_cycles:
        return (f"trees of {stats.tree_nodes / stats.tree_cycles:.1f} nodes in "
                f"{stats.tree_cycles} of {stats.target_passes} passes")  # fmt: skip
    return stats.tree_note


def summary_line(stats: Stats, finish_reason: str) -> str:
    """The short summary printed after an answer."""
    parts = [token_count(stats.generated_tokens)]
    if stats.decode_tokens_per_s is not None:
        parts.append(f"{stats.decode_tokens_per_s:.1f} tok/s")
    if stats.draft_proposed:
        sources = sources_line(stats.by_source)
        parts.append(
            acceptance_text(stats.draft_accepted, stats.draft_proposed)
            + (f" ({sources})" if sources else "")
        )
    if stats.forced_tokens:
        parts.append(f"{stats.forced_tokens} forced")
    if stats.plain_reason:  # with guesses too: a drafter that failed was switched off
        parts.append(stats.plain_reason)
    if stats.tokens_per_pass is not None:
        parts.append(f"{stats.tokens_per_pass:.2f} tokens/pass")
    trees = tree_text(stats)
    if trees:
        parts.append(trees)
    if stats.drafter_choice:
        parts.append(f"--draft auto: {stats.drafter_choice}")
    if stats.cached_tokens:
        disk = f" ({stats.disk_tokens} from disk)" if stats.disk_tokens else ""
        parts.append(f"{stats.cached_tokens} of {stats.prompt_tokens} prompt ids cached{disk}")
    parts.append(f"ttft {stats.ttft_s:.2f}s")
    parts.append(finish_reason)
    return " · ".join(parts)


class Ema:
    """An exponential moving average that is None until its first sample."""

    def __init__(self, weight: float):
        self.weight = weight
        """How much a new sample moves the average (0..1)."""
        self.value: float | None = None

    def add(self, sample: float) -> None:
        if self.value is None:
            self.value = sample
        else:
            self.value += self.weight * (sample - self.value)
