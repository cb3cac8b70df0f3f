"""The tool fixture models do what tests/toolkit.py says, by mlx-lm's own greedy decoding: the
real Qwen3 tokenizer and template, AGENT_CALLS' call per agent (on short prompts and on the agents'
captured requests in full), `Done.` after a tool result, a draft that mostly agrees, a text model
that never calls."""

from __future__ import annotations

import mlx.core as mx
import pytest
import toolkit
from mlx_lm import load
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache
from mlx_lm.utils import load_model

WEATHER = toolkit._function(
    "get_weather",
    "Current weather in a city.",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
SYSTEMS = {  # one line of each agent's own system prompt, and a plain one
    "claude_code": "You are Claude Code, Anthropic's official CLI for Claude.",
    "codex": "You are a coding agent running in the Codex CLI, a terminal-based coding assistant.",
    "opencode": "You are opencode, an interactive CLI tool that helps users with software tasks.",
    None: "You are a helpful assistant.",
}


@pytest.fixture(scope="module")
def tool_model(tmp_path_factory):
    return load(str(toolkit.save_tool_model(tmp_path_factory.mktemp("tool") / "model")))


def greedy(model, prompt: list[int], cache=None, max_tokens: int = 24) -> list[int]:
    said = []
    for token, _ in generate_step(
        mx.array(prompt), model, max_tokens=max_tokens, prompt_cache=cache
    ):
        said.append(int(token))
        if token == toolkit.IM_END:
            break
    return said


def answer(tokenizer, said: list[int]) -> str:
    assert said[-1] == toolkit.IM_END, tokenizer.decode(said)
    return tokenizer.decode(said[:-1])


def prefill(model, ids: list[int], cache) -> None:
    for start in range(0, len(ids), 2048):  # in chunks, as mlx-lm does: attention stays small
        model(mx.array(ids[start : start + 2048])[None], cache=cache)
        mx.eval([c.state for c in cache])


def test_qwen3_tokenizer_loads_with_its_tool_parser(tool_model):
    _, tokenizer = tool_model  # mlx_lm.load of a folder save_tool_model wrote
    assert len(tokenizer._tokenizer) == 151_669 <= toolkit.QWEN3_VOCAB
    assert tokenizer.eos_token_ids == {toolkit.IM_END}
    assert tokenizer.has_tool_calling
    assert (tokenizer.tool_call_start, tokenizer.tool_call_end) == ("<tool_call>", "</tool_call>")
    assert tokenizer.tool_parser.__module__ == "mlx_lm.tool_parsers.json_tools"


@pytest.mark.parametrize("think", [True, False])
# Codex is left out: the model finds it in Codex's real prompt (below), not in a one-line one.
@pytest.mark.parametrize("agent", ["claude_code", "opencode", None])
def test_tool_model_calls_the_agents_tool_then_says_done(tool_model, agent, think):
    model, tokenizer = tool_model
    messages = [
        {"role": "system", "content": SYSTEMS[agent]},
        {"role": "user", "content": "List the files here, please."},
    ]
    render = dict(tools=[WEATHER], add_generation_prompt=True, enable_thinking=think)
    text = answer(tokenizer, greedy(model, tokenizer.apply_chat_template(messages, **render)))
    assert text == toolkit.answer_text(agent)
    call = tokenizer.tool_parser(text.split("<tool_call>")[1].split("</tool_call>")[0], [WEATHER])
    assert (call["name"], call["arguments"]) == toolkit.AGENT_CALLS[agent]

    name, args = toolkit.AGENT_CALLS[agent]
    messages.append(
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": dict(name=name, arguments=args)}],
        }
    )
    messages.append({"role": "tool", "content": "notes.txt\nREADME.md"})
    said = greedy(model, tokenizer.apply_chat_template(messages, **render))
    assert answer(tokenizer, said) == "Done."


@pytest.mark.parametrize("agent", ["claude_code", "codex", "opencode"])
def test_tool_model_on_the_captured_agent_requests(tool_model, agent):
    """The first request and the follow-up with the tool's result, each rendered in full (7k-11k
    ids): the follow-up reuses the first one's common prefix from the cache."""
    model, tokenizer = tool_model
    first, followup = (
        tokenizer.apply_chat_template(*toolkit.agent_chat(agent, f), add_generation_prompt=True)
        for f in (False, True)
    )
    # Qwen3's template renders the first request as a prefix of the follow-up; keep one id to feed
    same = (i for i, (a, b) in enumerate(zip(first, followup)) if a != b)
    common = min(next(same, len(first)), len(first) - 1)
    cache = make_prompt_cache(model)
    prefill(model, first[:common], cache)
    assert answer(tokenizer, greedy(model, first[common:], cache)) == toolkit.answer_text(agent)
    trim_prompt_cache(cache, cache[0].offset - common)
    assert answer(tokenizer, greedy(model, followup[common:], cache)) == "Done."


def chat_ids(tokenizer, agent: str | None) -> list[int]:
    messages = [
        {"role": "system", "content": SYSTEMS[agent]},
        {"role": "user", "content": "What is in this folder?"},
    ]
    return tokenizer.apply_chat_template(messages, tools=[WEATHER], add_generation_prompt=True)


def test_tool_draft_agrees_mostly_not_always(tool_model, tmp_path):
    """Teacher-forced on the target's answers, the draft's greedy guesses match most of them."""
    model, tokenizer = tool_model
    draft, _ = load_model(toolkit.save_tool_draft(tmp_path / "draft"))
    agree = total = 0
    for agent in toolkit.AGENT_CALLS:
        prompt = chat_ids(tokenizer, agent)
        said = greedy(model, prompt)
        hidden = draft.model(mx.array(prompt + said[:-1])[None])[:, len(prompt) - 1 :]
        guesses = draft.lm_head(hidden)[0].argmax(-1)  # logits at the answer's places only
        agree += sum(int(g) == t for g, t in zip(guesses.tolist(), said))
        total += len(said)
    assert 0.6 * total <= agree < total


def test_text_model_answers_text_never_a_call(tool_model, tmp_path):
    _, tokenizer = tool_model
    model, _ = load_model(toolkit.save_text_model(tmp_path / "text"))
    for agent in toolkit.AGENT_CALLS:
        said = greedy(model, chat_ids(tokenizer, agent), max_tokens=12)
        assert len(said) == 12 and max(said) < 151_643  # no special id: no tag, no <|im_end|>
        assert tokenizer.decode(said).strip()
