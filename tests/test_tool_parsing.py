"""Tool calls parsed from streamed text, whatever the chunk boundaries: Qwen3's JSON calls,
Qwen3.5's XML (qwen3_coder), gpt-oss's harmony channels and Llama 3's bare JSON. Several
calls, text around them, malformed calls (text, without their tags), and never a tag in the
content."""

from __future__ import annotations

import importlib
import json
import random

import pytest

from macspec.models.answer_stream import AnswerStream, Call, Reasoning, Text
from macspec.models.tools import HARMONY, LLAMA3_JSON, ToolFormat, history_message


def mlx_lm_format(name: str) -> ToolFormat:
    module = importlib.import_module(f"mlx_lm.tool_parsers.{name}")
    return ToolFormat(name, module.tool_call_start, module.tool_call_end, module.parse_tool_call)


JSON_TOOLS = mlx_lm_format("json_tools")
QWEN3_CODER = mlx_lm_format("qwen3_coder")
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            },
        },
    },
    {"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}},
]


def qwen3_call(name: str, arguments: dict) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def coder_call(name: str, arguments: dict) -> str:
    params = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in arguments.items())
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


def harmony_call(name: str, arguments: dict, end: str = "<|end|>") -> str:
    header = f"<|start|>assistant<|channel|>commentary to=functions.{name} <|constrain|>json"
    return f"{header}<|message|>{json.dumps(arguments)}{end}"


# (format, reasoning start, text, expected content, expected calls)
CASES = [
    (
        JSON_TOOLS,
        None,
        "Let me check.\n\n"
        + qwen3_call("get_weather", {"city": "Paris"})
        + "\n"
        + qwen3_call("ls", {"path": "."}),
        "Let me check.",
        [("get_weather", {"city": "Paris"}), ("ls", {"path": "."})],
    ),
    (  # a double-encoded argument string is decoded once
        JSON_TOOLS,
        None,
        '<tool_call>\n{"name": "ls", "arguments": "{\\"path\\": \\"/tmp\\"}"}\n</tool_call>',
        "",
        [("ls", {"path": "/tmp"})],
    ),
    (  # a malformed call comes back as text, without its tags; the good one is a call
        JSON_TOOLS,
        None,
        'A <tool_call>\n{"name": "ls", "arguments": {</tool_call>\n'
        + qwen3_call("ls", {})
        + " tail",
        'A{"name": "ls", "arguments": {tail',
        [("ls", {})],
    ),
    (  # arguments that hold a tag's text (a file being written): one call, parsed whole
        JSON_TOOLS,
        None,
        qwen3_call("write", {"text": "say <tool_call> here"}),
        "",
        [("write", {"text": "say <tool_call> here"})],
    ),
    (  # a call cut off by a new start tag (a forced opening the model did not continue): the
        # cut one is text, the new one a call, and no tag text in the content
        JSON_TOOLS,
        None,
        '<tool_call>\n{"name": "ls", "arguments": ' + qwen3_call("ls", {"path": "."}),
        '{"name": "ls", "arguments":',
        [("ls", {"path": "."})],
    ),
    (  # thinking first, then calls; a call cut by the end of the answer is parsed as it is
        JSON_TOOLS,
        False,
        "<think>\nI should look.\n</think>\n\n"
        + qwen3_call("get_weather", {"city": "Oslo"})
        + '\n<tool_call>\n{"name": "ls", "arguments": {}}',
        "",
        [("get_weather", {"city": "Oslo"}), ("ls", {})],
    ),
    (
        QWEN3_CODER,
        True,
        "Weather first.\n</think>\n\nSure.\n"
        + coder_call("get_weather", {"city": "Rome", "days": 3})
        + "\n"
        + coder_call("ls", {}),
        "Sure.",
        [("get_weather", {"city": "Rome", "days": 3}), ("ls", {})],
    ),
    (
        HARMONY,
        None,
        "<|channel|>analysis<|message|>Need weather.<|end|>"
        + harmony_call("get_weather", {"city": "Lima"}, end=""),
        "",
        [("get_weather", {"city": "Lima"})],
    ),
    (
        HARMONY,
        None,
        "<|channel|>analysis<|message|>Just answer.<|end|><|start|>assistant<|channel|>final"
        "<|message|>It is <b>sunny</b>.",
        "It is <b>sunny</b>.",
        [],
    ),
    (  # to= before the channel, as the template renders history
        HARMONY,
        None,
        '<|channel|>commentary to=functions.ls<|message|>{"path": "src"}',
        "",
        [("ls", {"path": "src"})],
    ),
    (
        HARMONY,
        None,
        "<|channel|>commentary to=functions.ls <|constrain|>json<|message|>{not json",
        "{not json",
        [],
    ),
    (
        LLAMA3_JSON,
        None,
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Kyiv"}}; '
        '{"name": "ls", "parameters": {}}',
        "",
        [("get_weather", {"city": "Kyiv"}), ("ls", {})],
    ),
    (LLAMA3_JSON, None, "  It is {warm} today.", "  It is {warm} today.", []),
    (LLAMA3_JSON, None, '{"answer": 42}', '{"answer": 42}', []),
]
TAGS = ["<tool_call>", "</tool_call>", "<function=", "<|channel|>", "<|message|>", "<|end|>"]


def streamed(fmt, start, text: str, rng: random.Random) -> AnswerStream:
    stream = AnswerStream(start, fmt, TOOLS)
    pieces, at = [], 0
    while at < len(text):
        size = rng.randint(1, 9)
        pieces += stream.feed(text[at : at + size])
        at += size
    pieces += stream.finish()
    assert pieces == stream.pieces
    return stream


@pytest.mark.parametrize(("fmt", "start", "text", "content", "calls"), CASES)
def test_calls_and_content_do_not_depend_on_chunk_boundaries(fmt, start, text, content, calls):
    rng = random.Random(7)
    whole = streamed(fmt, start, text, random.Random(0))
    for _ in range(60):
        stream = streamed(fmt, start, text, rng)
        assert stream.text == content
        assert [(c.name, c.arguments) for c in stream.calls] == calls
        assert stream.reasoning == whole.reasoning
        assert not any(tag in stream.text for tag in TAGS if tag not in content)


def test_every_chunking_of_a_short_answer_gives_the_same_pieces():
    text = "Hi.\n" + qwen3_call("ls", {"p": 1}) + "\nBye"
    for cut in range(1, len(text)):
        for cut2 in range(cut + 1, len(text), 5):
            stream = AnswerStream(None, JSON_TOOLS, TOOLS)
            for part in (text[:cut], text[cut:cut2], text[cut2:]):
                stream.feed(part)
            stream.finish()
            assert stream.text == "Hi.Bye" and [c.name for c in stream.calls] == ["ls"]


def test_without_tools_the_text_is_untouched():
    text = "x " + qwen3_call("ls", {})
    stream = AnswerStream(None, JSON_TOOLS, None)
    assert [p.text for p in stream.feed(text) + stream.finish()] == [text]


def test_a_forced_opening_is_continued_by_the_answer():
    opening = JSON_TOOLS.opening("get_weather")
    assert opening == '<tool_call>\n{"name": "get_weather", "arguments":'
    stream = AnswerStream(None, JSON_TOOLS, TOOLS, forced=opening)
    stream.feed(' {"city": "Nice"}}\n</tool_call>')
    stream.finish()
    assert stream.text == "" and stream.calls[0].arguments == {"city": "Nice"}
    harmony = "<|channel|>commentary to=functions.ls <|constrain|>json<|message|>"
    assert HARMONY.opening("ls") == harmony
    assert QWEN3_CODER.opening("ls") == "<tool_call>\n<function=ls>\n"


def test_pieces_come_in_order():
    stream = AnswerStream(False, JSON_TOOLS, TOOLS)
    stream.feed("<think>\nhm\n</think>\n\nSee:\n" + qwen3_call("ls", {}) + "\nok")
    stream.finish()
    kinds = [type(p) for p in stream.pieces]
    assert kinds == [Reasoning, Text, Call, Text]


def test_history_arguments_become_objects_for_the_template():
    message = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "1", "function": {"name": "ls", "arguments": '{"p": 1}'}}],
    }
    assert history_message(message)["tool_calls"][0]["function"]["arguments"] == {"p": 1}


def test_calls_as_text_drop_their_tags():
    """tool_choice 'none' with tools: a call the model makes anyway is text, tags dropped."""
    text = "Sure. " + qwen3_call("ls", {"path": "."}) + " done"
    for size in (1, 3, 7):
        stream = AnswerStream(None, JSON_TOOLS, None, calls_as_text=True)
        for at in range(0, len(text), size):
            stream.feed(text[at : at + size])
        stream.finish()
        assert not stream.calls and "tool_call" not in stream.text
        assert '"name": "ls"' in stream.text and stream.text.startswith("Sure.")
