"""Agents' requests through `macspec serve`: the prompt each agent sends (in Qwen3 tokens), and
tokens per target pass by drafter over each agent's tool round trip (its first request, then
the follow-up that carries the tool's result), replayed from tests/fixtures/agents on the tiny
tool model (tests/toolkit.py) and its noisy draft, greedy, every answer checked against the
target alone.

    python scripts/figures/agent_figures.py
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parents[2] / "tests"))

from toolkit import agent_request, save_tool_draft, save_tool_model  # noqa: E402

from macspec.engine.generate.loop import GenerationConfig  # noqa: E402
from macspec.models.catalog import resolve_models  # noqa: E402
from macspec.models.pairs import open_pair  # noqa: E402
from macspec.serve.backend import Backend, Defaults  # noqa: E402
from macspec.serve.server import ServerThread  # noqa: E402

AGENTS = ["claude_code", "codex", "opencode"]
DRAFTERS = ["model", "lookup", "hybrid", "auto"]


def replay(server, capture: dict) -> None:
    body = dict(capture["body"])
    body["stream"] = False
    body.pop("stream_options", None)  # only with stream, as OpenAI says too
    url = server.base_url.removesuffix("/v1") + capture["path"]
    reply = httpx.post(url, json=body, headers={"x-api-key": "x"}, timeout=600)
    if reply.is_error:
        raise SystemExit(f"{capture['path']}: {reply.status_code} {reply.text[:500]}")


class Recording(Backend):
    """A backend that keeps the prompt ids of every request it prepares."""

    prompts: list[list[int]]

    def prepare_turn(self, turn):
        prepared = super().prepare_turn(turn)
        self.prompts.append(prepared.prompt)
        return prepared


def main() -> None:
    root = Path(tempfile.mkdtemp())
    target, draft = save_tool_model(root / "target"), save_tool_draft(root / "draft")
    resolved = resolve_models(None, str(target), str(draft))
    alone = open_pair(resolved, no_draft=True).engine
    config = GenerationConfig(max_tokens=64)
    sizes: dict[str, list[int]] = {}
    print("drafter  agent        tokens/pass  acceptance (by drafter)       same as alone")
    for drafter in DRAFTERS:
        k = None if drafter == "auto" else "4"
        opened = open_pair(resolved, k, draft=drafter)
        backend = Recording(
            opened.engine, opened.tokenizer, "tool", context_length=32768,
            defaults=Defaults(max_tokens=64), any_model=True,
        )  # fmt: skip
        backend.prompts = []
        with ServerThread(backend) as server:
            for agent in AGENTS:
                before, seen = len(backend.worker.recent), len(backend.prompts)
                for followup in (False, True):
                    replay(server, agent_request(agent, followup))
                dones = list(backend.worker.recent)[before:]
                prompts = backend.prompts[seen:]
                stats = [d.stats for d in dones]
                passes = sum(s.target_passes for s in stats)
                decided = sum(s.generated_tokens + s.end_tokens for s in stats)
                proposed = sum(s.draft_proposed for s in stats)
                accepted = sum(s.draft_accepted for s in stats)
                by_source: dict[str, list[int]] = {}
                for s in stats:
                    for name, (p, a) in s.by_source.items():
                        counts = by_source.setdefault(name, [0, 0])
                        counts[0] += p
                        counts[1] += a
                sources = ", ".join(f"{n} {a}/{p}" for n, (p, a) in by_source.items()) or "-"
                rate = f"{accepted / proposed:.2f}" if proposed else "-"
                sizes[agent] = [len(p) for p in prompts]
                same = len(dones) == len(prompts) == 2 and all(
                    d.tokens == list(alone.generate(tuple(p), config))[-1].tokens
                    for d, p in zip(dones, prompts)
                )
                print(
                    f"{drafter:8} {agent:12} {decided / passes:11.2f}  {rate:5} ({sources:22})"
                    f"  {'yes' if same else 'NO'}",
                    flush=True,
                )
    print("prompt sizes, first and follow-up (Qwen3 tokens):", json.dumps(sizes))


if __name__ == "__main__":
    main()
