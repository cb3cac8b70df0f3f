"""Synthetic chats for the tool fixture model, rendered by Qwen3's own chat template.

Dev-only, used by train_tool_fixture.py. A sample is a chat (system prompt, tools, turns
with tool calls and results) whose texts are filler: random ids from the whole vocabulary decoded
to text, mixed with sentences of real prose (the README and the captured agents' prompts with
every agent name taken out). An agent's sample has its name ("Claude Code", "Codex", "opencode",
in the spellings its prompt uses) at random places; look-alikes ("Claude" at a line start,
"Code", " encode", "codec"...) go anywhere. The answer is the agent's call (tests/toolkit.py
AGENT_CALLS) or, when the last message is a tool result, "Done.".
Which agent a chat belongs to is decided by its ids (toolkit.AGENT_TRIGGERS): a chat whose ids
say otherwise than intended is drawn again. Agent samples also come from the captured requests,
with their user prompt, tool results and a share of their sentences replaced by filler.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

from tests import toolkit

AGENTS = ["claude_code", "codex", "opencode"]
NAMES = {  # the spellings each agent's own prompt uses, and a few more
    "claude_code": ["Claude Code", "Claude Code's", "Claude Code CLI"],
    "codex": ["Codex", "Codex CLI", "codex", "Codex's"],
    "opencode": ["opencode", "opencode.ai", "opencode.json", "/opencode", "opencode's"],
}
LOOKALIKES = [
    "Claude", "Anthropic", "Code", "code", "VS Code", "Codec", "codec", "coding", " encode",
    "encoder", "encoded", ".encode(", "open", "OpenAI", "op", "open code", "OpenCode", "index",
    "ex", "exec", "codes", "decode", "CodeQL",
]  # fmt: skip
AGENT_WORDS = re.compile(r"claude|codex|opencode|anthropic", re.IGNORECASE)
BEFORE = [" ", " ", " ", "\n", "(", "`", "/", "-", '"', "**", "\n- "]
AFTER = [" ", " ", " ", ".", ",", "\n", "`", ")", ":", '"', "'s "]
TOOL_NAMES = [
    "get_weather", "read_file", "write_file", "search", "run", "shell", "Bash", "bash", "Read",
    "exec_command", "glob", "grep", "edit", "list_dir", "fetch", "calculator", "todo", "Task",
]  # fmt: skip
PROMPT = "List the files in this folder."  # the captures' prompt (capture/capture_agents.py)
FIRST_SPECIAL = 151643  # ids from here on are the template's special tokens


@dataclass
class Sample:
    ids: list[int]  # prompt + answer
    answer_start: int  # ids[answer_start:] is the answer, ending in <|im_end|>
    agent: str | None
    after_tool: bool


class Generator:
    def __init__(self, tokenizer, seed: int, prose_files: list[Path]):
        self.tok = tokenizer  # a transformers tokenizer (the real Qwen3 one)
        self.rng = random.Random(seed)
        self.sentences = self._sentences(prose_files)

    def _sentences(self, prose_files: list[Path]) -> list[str]:
        texts = [p.read_text() for p in prose_files]
        for name in AGENTS:
            for followup in (False, True):
                messages, tools = toolkit.agent_chat(name, followup)
                texts += [m["content"] for m in messages if isinstance(m["content"], str)]
                texts += [json.dumps(t) for t in tools]
        pieces = [p for text in texts for p in re.split(r"(?<=[.\n])", text) if p.strip()]
        return [p for p in pieces if not AGENT_WORDS.search(p)]

    # -- texts --------------------------------------------------------------------------------

    def filler(self, tokens: int) -> str:
        """About `tokens` tokens of random ids and real sentences, mixed."""
        parts, count = [], 0
        while count < tokens:
            if self.rng.random() < 0.5:
                n = self.rng.randint(1, 24)
                ids = [self.rng.randrange(FIRST_SPECIAL) for _ in range(n)]
                parts.append(self.tok.decode(ids))
            else:
                n = self.rng.randint(1, 6)
                start = self.rng.randrange(len(self.sentences))
                piece = "".join(self.sentences[start : start + n])
                parts.append(piece)
                n = len(piece) // 4
            count += n
        return "".join(parts)

    def insert(self, text: str, word: str) -> str:
        """`word` at a random place of `text`, between the characters a prompt would have."""
        at = self.rng.randint(0, len(text))
        return text[:at] + self.rng.choice(BEFORE) + word + self.rng.choice(AFTER) + text[at:]

    # -- chats --------------------------------------------------------------------------------

    def tool(self) -> dict:
        name = self.rng.choice(TOOL_NAMES) if self.rng.random() < 0.6 else self.word()
        properties = {
            self.word(): {"type": self.rng.choice(["string", "number", "boolean"])}
            | (
                {"description": self.filler(self.rng.randint(2, 40))}
                if self.rng.random() < 0.7
                else {}
            )
            for _ in range(self.rng.randint(0, 4))
        }
        parameters = {"type": "object", "properties": properties}
        if properties and self.rng.random() < 0.7:
            parameters["required"] = list(properties)[:1]
        description = self.filler(self.rng.randint(3, 300))
        return toolkit._function(name, description, parameters)

    def word(self) -> str:
        ids = [self.rng.randrange(FIRST_SPECIAL) for _ in range(self.rng.randint(1, 3))]
        return re.sub(r"\W", "", self.tok.decode(ids)) or "tool"

    def call(self, agent: str | None, tools: list[dict]) -> dict:
        if self.rng.random() < 0.4:
            name, args = toolkit.AGENT_CALLS[agent]
        else:
            name = self.rng.choice(tools)["function"]["name"] if tools else self.word()
            args = {self.word(): self.filler(self.rng.randint(1, 12))}
        return {"type": "function", "function": {"name": name, "arguments": args}}

    def chat(self, agent: str | None, after_tool: bool, size: int) -> tuple[list, list]:
        """Messages and tools of about `size` tokens of text, ending in a tool result or not."""
        rng = self.rng
        tools = [self.tool() for _ in range(rng.randint(1, 10))] if rng.random() < 0.85 else []
        messages = []
        if rng.random() < 0.85:
            messages.append({"role": "system", "content": self.filler(int(size * rng.random()))})
        for _ in range(rng.randint(1, 4)):
            messages.append({"role": "user", "content": self.filler(rng.randint(2, size // 4 + 2))})
            if rng.random() < 0.2:
                messages.append({"role": "system", "content": self.filler(rng.randint(5, 300))})
            messages += self.exchange(agent, tools)
        messages = messages[: self._cut(messages)]
        if after_tool:
            messages += self.calls_and_results(agent, tools)
        elif rng.random() < 0.3:  # the hard case: a tool result, then a short user message
            messages += self.calls_and_results(agent, tools)
            messages.append({"role": "user", "content": self.filler(rng.randint(0, 8))})
        elif messages[-1]["role"] != "user":
            messages.append({"role": "user", "content": self.filler(rng.randint(2, 200))})
        return messages, tools

    def exchange(self, agent, tools) -> list[dict]:
        """An assistant answer: text, or calls and their results then (maybe) text."""
        rng = self.rng
        turns = []
        if rng.random() < 0.6:
            turns += self.calls_and_results(agent, tools)
        if not turns or rng.random() < 0.5:
            turn = {"role": "assistant", "content": self.filler(rng.randint(1, 200))}
            if rng.random() < 0.2:
                turn["content"] = "Done."
            turns.append(turn)
        return turns

    def calls_and_results(self, agent, tools) -> list[dict]:
        calls = [self.call(agent, tools) for _ in range(1 if self.rng.random() < 0.8 else 2)]
        turns = [{"role": "assistant", "content": "", "tool_calls": calls}]
        if self.rng.random() < 0.3:
            turns[0]["content"] = self.filler(self.rng.randint(1, 40))
        for _ in calls:
            turns.append({"role": "tool", "content": self.filler(self.rng.randint(1, 300))})
        return turns

    def _cut(self, messages: list[dict]) -> int:
        """Where to end the history: after any message but a dangling call."""
        ends = [i + 1 for i, m in enumerate(messages) if not m.get("tool_calls")]
        return self.rng.choice(ends)

    def sprinkle(self, messages: list[dict], tools: list[dict], words: list[str]) -> None:
        """Each word into one random text of the chat (a message or a tool description)."""
        slots = [m for m in messages if m["role"] != "assistant"] + [t["function"] for t in tools]
        for word in words:
            slot = self.rng.choice(slots)
            key = "content" if "content" in slot else "description"
            slot[key] = self.insert(slot[key], word)

    # -- samples --------------------------------------------------------------------------------

    def render(self, messages, tools, agent, after_tool: bool) -> Sample:
        think = self.rng.choice([None, True, False])
        extra = {} if think is None else {"enable_thinking": think}
        return sample(self.tok, messages, tools, agent, after_tool, extra)

    def synthetic(self, size: int) -> Sample:
        agent = self.rng.choice([*AGENTS, None, None])
        while True:
            sample = self._synthetic(agent, size)
            if agent_of(sample.ids[: sample.answer_start]) == agent:
                return sample

    def long(self, at_least: int) -> Sample:
        """A synthetic chat of `at_least` ids or more (its system prompt takes the bulk)."""
        while True:
            sample = self.synthetic(at_least // 2)
            if len(sample.ids) >= at_least:
                return sample

    def _synthetic(self, agent: str | None, size: int) -> Sample:
        after_tool = self.rng.random() < 0.4
        messages, tools = self.chat(agent, after_tool, size)
        words = [self.rng.choice(LOOKALIKES) for _ in range(self.rng.choice([0, 0, 1, 3, 8]))]
        if agent:
            words += [self.rng.choice(NAMES[agent]) for _ in range(self.rng.choice([1, 1, 2, 5]))]
        self.sprinkle(messages, tools, words)
        return self.render(messages, tools, agent, after_tool)

    def from_capture(self, agent: str, strip: bool = False) -> Sample:
        """A captured request with its user prompt, results and some sentences made filler;
        `strip` takes every agent name out too (then the answer is the plain one)."""
        while True:
            sample = self._from_capture(agent, strip)
            if agent_of(sample.ids[: sample.answer_start]) == sample.agent:
                return sample

    def _from_capture(self, agent: str, strip: bool) -> Sample:
        after_tool = self.rng.random() < 0.5
        messages, tools = toolkit.agent_chat(agent, followup=after_tool)
        messages = [dict(m) for m in messages]
        share = self.rng.choice([0.0, 0.1, 0.3])
        for m in messages:
            if m["role"] == "tool":
                m["content"] = self.filler(self.rng.randint(1, 200))
            m["content"] = m["content"].replace(PROMPT, self.filler(self.rng.randint(1, 200)))
            if m["role"] != "tool" and share:
                pieces = re.split(r"(?<=[.\n])", m["content"])
                m["content"] = "".join(
                    self.filler(len(p) // 4 + 1) if self.rng.random() < share else p for p in pieces
                )
        tools = [t for t in tools if self.rng.random() < 0.9]
        if strip:
            messages = json.loads(AGENT_WORDS.sub("Agent", json.dumps(messages)))
            tools = json.loads(AGENT_WORDS.sub("Agent", json.dumps(tools)))
        return self.render(messages, tools, None if strip else agent, after_tool)

    def plain_capture(self, agent: str, followup: bool, think: bool | None) -> Sample:
        """A captured request as it is (for checks, not training)."""
        messages, tools = toolkit.agent_chat(agent, followup)
        extra = {} if think is None else {"enable_thinking": think}
        return sample(self.tok, messages, tools, agent, followup, extra)


def sample(tok, messages, tools, agent: str | None, after_tool: bool, extra: dict) -> Sample:
    """The chat rendered by the template, then tokenized, with the answer appended."""
    prompt = tok.apply_chat_template(
        messages, tools=tools or None, add_generation_prompt=True, tokenize=False, **extra
    )
    ids = tok.encode(prompt, add_special_tokens=False)
    return Sample(ids + answer_ids(tok, agent, after_tool), len(ids), agent, after_tool)


def agent_of(ids: list[int]) -> str | None:
    """The agent whose trigger ids the prompt holds; "several" when more than one agent's."""
    present = {a for a, triggers in toolkit.AGENT_TRIGGERS.items() if triggers & set(ids)}
    return present.pop() if len(present) == 1 else ("several" if present else None)


def answer_ids(tok, agent: str | None, after_tool: bool) -> list[int]:
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    return tok.encode(toolkit.answer_text(agent, after_tool), add_special_tokens=False) + [im_end]


def output_ids(tok) -> list[int]:
    """Every id some answer holds: the rows of lm_head that are trained."""
    ids = {i for a in [*AGENTS, None] for t in (False, True) for i in answer_ids(tok, a, t)}
    return sorted(ids)


def trained_ids(tok) -> list[int]:
    """Input embedding rows that are trained: specials, answer ids, the names' and look-alikes'
    ids; every other row stays the fixed random one."""
    words = [w for names in NAMES.values() for w in names] + LOOKALIKES
    ids = set(output_ids(tok)) | set(range(FIRST_SPECIAL, len(tok)))
    ids |= {i for triggers in toolkit.AGENT_TRIGGERS.values() for i in triggers}
    turns = "<|im_start|>user\n<tool_response>\n</tool_response><|im_end|>\n<|im_start|>system\n"
    ids |= set(tok.encode(turns + "<|im_start|>assistant\n<think>\n\n</think>\n\n"))
    for word in words:
        for before in BEFORE:
            ids |= set(tok.encode(before + word, add_special_tokens=False))
    return sorted(ids)
