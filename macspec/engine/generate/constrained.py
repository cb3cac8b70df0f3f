"""The guess-and-verify loop under a grammar: the target's distribution at every position is
p' = normalize(p * mask), the mask being the grammar's after the ids before that position.

The masks are computed on the host, by the matcher, from ids the host knows, so a cycle is:
  1. guesses: the ids the grammar forces (free: no draft step), else the drafter's, read back;
  2. the host keeps the guesses the grammar admits, and the mask at each position of the pass;
  3. one target pass over them, masked; the verdict (greedy, coupled or the rejection rule)
     on the masked rows, read back;
  4. the matcher keeps the accepted guesses and the target's token.
The verdict is exact for any guesses: a guess outside the mask has p'(x) = 0 and is never
kept, and the rejection rule holds with the q a guess was really drawn from (the drafter's own,
unmasked). A draft model's cycle waits twice (its guesses, then the verdict); prompt lookup's
and forced ids' guesses are on the host already: one wait.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import mlx.core as mx

from macspec.engine.core.config import GenerationConfig
from macspec.engine.core.cycle import Cycle
from macspec.engine.core.events import Source
from macspec.engine.core.grammar import Constraint
from macspec.engine.core.sampling import Randomness, probabilities
from macspec.engine.core.verify import greedy_verdict, sampled_verdict


def constrained_cycles(
    engine: Any, context: list[int], config: GenerationConfig, rng: Randomness | None
) -> Iterator[Cycle | tuple[int, Source]]:
    """Cycles after the prompt (already prefilled, `context` its ids) until max_tokens or the
    end of sequence; `engine` is the loop's Engine. Each cycle leaves the target's cache
    holding the committed ids but the last, as the unconstrained loop does."""
    target, drafter, policy, params = engine.target, engine.drafter, engine.policy, config.sampling
    guard = engine.guard
    constraint = Constraint(config.grammar, engine.tokenizer)
    delivered = 0
    while delivered < config.max_tokens:
        begun = time.perf_counter()
        room = config.max_tokens - delivered - 1  # the target adds one token of its own
        guesses, q, source, steps, fed = constraint.forced()[: max(room, 0)], None, "grammar", 0, 0
        forced = bool(guesses)
        requested = policy.draft_length() if engine.drafting() and not forced else 0
        if requested and room > 0:
            draws = rng.draws(requested, len(context)) if rng is not None else None
            draft = guard.call("propose", _listed, drafter, context, min(requested, room), params,
                               draws)  # fmt: skip
            if draft is not None:  # else the drafter failed: this cycle is a plain step
                guesses, q, source, steps, fed = draft
        guesses = constraint.admitted(guesses, engine.eos_ids)
        accepted, token, verified = _verify(engine, context, guesses, q, constraint, params, rng)
        kept = guesses[:accepted] + [token]
        constraint.keep(kept)
        target.trim_to(len(context) + accepted)
        context += kept
        if drafter is not None:
            guard.call("rollback", drafter.rollback, len(context) - 1)
        cycle = Cycle(
            requested=requested,
            proposed=len(guesses),
            accepted=accepted,
            draft_s=0.0,
            verify_s=verified - begun,
            overhead_s=time.perf_counter() - verified,
            draft_steps=steps,
            draft_fed=fed,
            draft_source=source if guesses else None,
            fed=len(guesses) + 1,
            refed=0,
            timed=False,
        )
        if drafter is not None and not forced:  # forced ids say nothing of the drafter
            policy.observe(cycle)
        yield cycle
        for i, kept_id in enumerate(kept):
            delivered += 1
            yield kept_id, (Source.DRAFT if i < len(kept) - 1 else Source.TARGET)
            if delivered >= config.max_tokens:
                return


def _listed(drafter, context, k, params, draws) -> tuple[list[int], Any, str, int, int]:
    """The drafter's guesses read to the host (a grammar admits them there), with their q,
    source and costs."""
    draft = drafter.propose(context, k, params, draws, None)
    tokens = draft.tokens
    guesses = tokens.tolist() if isinstance(tokens, mx.array) else list(tokens)
    return guesses, draft.q, draft.source, draft.steps, draft.fed


def _verify(
    engine: Any,
    context: list[int],
    guesses: list[int],
    q: mx.array | None,
    constraint: Constraint,
    params,
    rng: Randomness | None,
) -> tuple[int, int, float]:
    """One masked target pass over the guesses: (accepted, the target's token, when read)."""
    target = engine.target
    pending = context[len(target) :]
    target.checkpoint()
    ids = mx.array(pending + guesses, mx.uint32)
    logits = target.forward(ids)[-(len(guesses) + 1) :, : engine.vocab_size]
    mask = mx.array(constraint.masks_along(guesses, logits.shape[-1]))
    logits = mx.where(mask, logits, mx.array(-float("inf"), logits.dtype))
    drafted = mx.array(guesses, mx.uint32)
    every = mx.array(len(guesses), mx.int32)
    if params.greedy:
        accepted, token = greedy_verdict(logits, drafted, every)
    elif rng.noise is not None:  # coupled: the target's own seeded picks, kept while equal
        scores = mx.log(probabilities(logits, params))
        scores = scores + rng.noise.rows(len(context), scores.shape[0], scores.shape[-1])
        accepted, token = greedy_verdict(scores, drafted, every)
    elif not guesses:  # a plain step samples as the unconstrained loop's plain step does
        accepted, token = mx.array(0), rng.pick(probabilities(logits, params), len(context))[0]
    else:
        p = probabilities(logits, params)
        q = q[: len(guesses)] if q is not None else None
        accepted, token = sampled_verdict(p, q, drafted, every, rng.keys.next())
    read = mx.stack([accepted.astype(mx.int32), token.astype(mx.int32)]).tolist()
    return read[0], read[1], time.perf_counter()
