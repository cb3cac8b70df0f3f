"""A thinking budget (Anthropic's `thinking.budget_tokens`): after that many reasoning tokens
the reasoning is closed and the answer follows, one request alone or in a batch, and the
answer is what the target writes after the prompt, the budget's tokens and the closing."""

from __future__ import annotations

import asyncio

import pytest
import tiny
from mlx_lm.tokenizer_utils import load as load_tokenizer
from test_thinking import write_qwen3_tokenizer

from macspec.engine.batch.engine import BatchEngine
from macspec.engine.core.events import Done, Token
from macspec.engine.generate.loop import Engine, GenerationConfig
from macspec.serve.batch_worker import BatchWorker
from macspec.serve.budget import CLOSING, ThinkingBudget
from macspec.serve.worker import Job, Worker

BUDGET = 5


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    folder = tmp_path_factory.mktemp("budget")
    write_qwen3_tokenizer(folder)
    tok = load_tokenizer(folder, eos_token_ids=[258])
    model = tiny.random_model(0, tiny.model_args(vocab=261), scale=3.0)
    prompt = tok.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n")
    return tok, model, prompt


def run_job(worker, prompt, config, budget) -> tuple[list, Done]:
    loop = asyncio.new_event_loop()
    job = Job(prompt, config, loop)
    job.budget = budget
    worker.start()
    worker.submit(job)

    async def collect():
        events = []
        while not events or not isinstance(events[-1], Done):
            events.append(await asyncio.wait_for(job.events.get(), 120))
        return events

    try:
        events = loop.run_until_complete(collect())
    finally:
        worker.stop()
        loop.close()
    return events, events[-1]


@pytest.mark.parametrize("batched", [False, True])
def test_the_reasoning_is_closed_at_the_budget(setup, batched):
    tok, model, prompt = setup
    config = GenerationConfig(max_tokens=20)
    closing = tok.encode(CLOSING, add_special_tokens=False)
    first = list(Engine(model, tok).generate(prompt, GenerationConfig(max_tokens=BUDGET)))[-1]
    rest = list(
        Engine(model, tok).generate(
            prompt + first.tokens + closing,
            GenerationConfig(max_tokens=20 - BUDGET - len(closing)),
        )
    )[-1]
    worker = BatchWorker(BatchEngine(model, tok), 2) if batched else Worker(Engine(model, tok))
    events, done = run_job(worker, prompt, config, ThinkingBudget(BUDGET, inside=True))
    assert done.tokens == first.tokens + closing + rest.tokens
    assert done.text == first.text + CLOSING + rest.text
    streamed = "".join(e.text for e in events if isinstance(e, Token)) + done.tail
    assert streamed == done.text
    assert len(done.tokens) <= config.max_tokens
    assert done.stats.generated_tokens == len(done.tokens)
    # The two parts' figures join: a decode rate over all but the first token's pass.
    assert done.stats.steady_tokens == len(done.tokens) - 1  # plain decoding: one per pass
    assert done.stats.decode_tokens_per_s is not None
