"""The target's own answers to the prompts, generated with macspec's engine: the draft's lessons."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import mlx.core as mx
import mlx.nn as nn

from macspec.engine.core.events import Done
from macspec.engine.core.sampling import SamplingParams
from macspec.engine.generate.loop import Engine, GenerationConfig
from macspec.tune.cache import AnswerCache
from macspec.tune.examples import Example


def generate_answers(
    target: nn.Module,
    tokenizer,
    prompts: Sequence[list[int]],
    max_tokens: int,
    temperature: float = 0.0,
    seed: int = 0,
    advance: Callable[[bool], None] | None = None,
    cache: AnswerCache | None = None,
) -> list[Example]:
    """The target alone answers each prompt (greedy, or sampled at `temperature` with seeds
    seed, seed + 1, ...), or the cache does when it kept that answer; `advance(cached)` is
    called after each answer."""
    engine = Engine(target, tokenizer)
    eos = end_of_answer(tokenizer)
    examples = []
    for i, prompt in enumerate(prompts):
        prompt_seed = seed + i if temperature > 0 else None
        key = (
            cache.answer_key(prompt, max_tokens, temperature, prompt_seed)
            if cache is not None
            else None
        )
        answer = cache.get_answer(key) if cache is not None else None
        cached = answer is not None
        if answer is None:
            config = GenerationConfig(
                max_tokens=max_tokens,
                sampling=SamplingParams(temperature=temperature),
                seed=prompt_seed,
            )
            done = next(e for e in engine.generate(prompt, config) if isinstance(e, Done))
            answer = list(done.tokens) + ([eos] if done.finish_reason == "stop" else [])
            if cache is not None:
                cache.put_answer(key, answer)
        if answer:
            examples.append(Example(list(prompt) + answer, len(prompt)))
        if advance is not None:
            advance(cached)
    return examples


def end_of_answer(tokenizer) -> int:
    """The id that ends an answer: the tokenizer's own EOS (the end of turn of instruct models)
    when it is one the engine stops on, else the smallest of those."""
    ids = sorted(tokenizer.eos_token_ids)
    primary = getattr(tokenizer, "eos_token_id", None)
    return primary if primary in ids else ids[0]


def add_target_logprobs(
    target: nn.Module,
    examples: list[Example],
    top_k: int,
    vocab_size: int | None = None,
    advance: Callable[[], None] | None = None,
    cache: AnswerCache | None = None,
) -> None:
    """Keep the target's top-k log-probabilities at every answer position (one target pass per
    example, unless the cache kept them), for the KL term of the loss."""
    for example in examples:
        if cache is not None and cache.get_logprobs(example, top_k):
            if advance is not None:
                advance()
            continue
        ids = mx.array(example.tokens[:-1])[None]
        logits = target(ids)[0, example.offset - 1 :, :vocab_size].astype(mx.float32)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        k = min(top_k, logprobs.shape[-1])
        top = mx.argpartition(-logprobs, kth=k - 1, axis=-1)[:, :k]
        example.top_ids = top.astype(mx.int32)
        example.top_logprobs = mx.take_along_axis(logprobs, top, axis=-1)
        mx.eval(example.top_ids, example.top_logprobs)
        if cache is not None:
            cache.put_logprobs(example, top_k)
        if advance is not None:
            advance()
