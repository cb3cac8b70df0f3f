"""Agents' requests through `macspec serve`: the prompt each agent sends (in Qwen3 tokens), and
tokens per target pass by drafter over each agent's tool round trip (its first request, then
the follow-up that carries the tool's result), replayed from tests/fixtures/agents on the tiny
tool model (tests/toolkit.py) and its noisy draft, greedy, every answer checked against the
target alone.

    python scripts/agent_figures.py
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))

from toolkit import agent_request, save_tool_draft, save_tool_model  # noqa: E402

from macspec.models.catalog import resolve_models  # noqa: E402
from macspec.models.pairs import open_pair  # noqa: E402
from macspec.serve.backend import Backend, Defaults  # noqa: E402
from macspec.serve.server import ServerThread  # noqa: E402

AGENTS = ["claude_code", "codex", "opencode"]
DRAFTERS = ["model", "lookup", "hybrid", "auto"]


def replay(server, capture: dict) -> None:
    body = dict(capture["body"])
    body["stream"] = False
    url = server.base_url.removesuffix("/v1") + capture["path"]
    reply = httpx.post(url, json=body, headers={"x-api-key": "x"}, timeout=600)
    reply.raise_for_status()


def main() -> None:
    root = Path(tempfile.mkdtemp())
    target, draft = save_tool_model(root / "target"), save_tool_draft(root / "draft")
    resolved = resolve_models(None, str(target), str(draft))
    alone = open_pair(resolved, no_draft=True)
    sizes = {}
    print("drafter  agent        tokens/pass  acceptance (by drafter)          same as alone")
    for drafter in DRAFTERS:
        k = None if drafter == "auto" else "4"
        opened = open_pair(resolved, k, draft=drafter)
        backend = Backend(
            opened.engine, opened.tokenizer, "tool", context_length=32768,
            defaults=Defaults(max_tokens=64), any_model=True,
        )  # fmt: skip
        with ServerThread(backend) as server:
            for agent in AGENTS:
                before = len(backend.worker.recent)
                prompts = []
                for followup in (False, True):
                    capture = agent_request(agent, followup)
                    replay(server, capture)
                    prompts.append(backend.worker.recent[-1])
                dones = list(backend.worker.recent)[before:]
                passes = sum(d.stats.target_passes for d in dones)
                decided = sum(len(d.tokens) + d.stats.end_tokens for d in dones)
                proposed = sum(d.stats.draft_proposed for d in dones)
                accepted = sum(d.stats.draft_accepted for d in dones)
                by_source: dict[str, list[int]] = {}
                for d in dones:
                    for name, (p, a) in d.stats.by_source.items():
                        counts = by_source.setdefault(name, [0, 0])
                        counts[0] += p
                        counts[1] += a
                sources = ", ".join(f"{n} {a}/{p}" for n, (p, a) in by_source.items()) or "-"
                rate = f"{accepted / proposed:.2f}" if proposed else "-"
                sizes[agent] = dones[0].stats.prompt_tokens
                same = all(
                    d.tokens == list(alone.engine.generate(tuple(c), _config()))[-1].tokens
                    for d, c in zip(dones, [_prompt_of(backend, agent, f) for f in (0, 1)])
                )
                print(
                    f"{drafter:8} {agent:12} {decided / passes:11.2f}  {rate:5} ({sources:24})"
                    f"  {'yes' if same else 'NO'}"
                )
    print("prompt sizes (Qwen3 tokens):", json.dumps(sizes))


def _config():
    from macspec.engine.loop import GenerationConfig

    return GenerationConfig(max_tokens=64)


def _prompt_of(backend: Backend, agent: str, followup: int) -> list[int]:
    """The prompt ids the server rendered for a capture (the same request, prepared again)."""
    from macspec.serve.anthropic_schema import MessagesRequest
    from macspec.serve.responses_schema import ResponsesRequest
    from macspec.serve.schema import ChatCompletionRequest

    body = agent_request(agent, bool(followup))["body"]
    if agent == "claude_code":
        turn = MessagesRequest.model_validate({**body, "max_tokens": 64}).to_generation_turn()
    elif agent == "codex":
        turn = ResponsesRequest.model_validate(body).to_turn()
    else:
        turn = ChatCompletionRequest.model_validate({**body, "max_tokens": 64}).to_turn()
    return backend.render_turn(turn)[0]


if __name__ == "__main__":
    main()
