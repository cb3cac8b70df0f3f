"""Thinking models: --think/--no-think render Qwen3's real chat template as
`apply_chat_template` does, and the reasoning is kept apart from the answer everywhere."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx_lm.models.cache import KVCache
from mlx_lm.tokenizer_utils import load as load_tokenizer

from macspec.cli import main
from macspec.cli.answer_output import ReasoningWriter
from macspec.engine.core.events import Done, Token
from macspec.engine.generate.loop import Engine, GenerationConfig
from macspec.models.reasoning import ReasoningSplitter, reasoning_start, split_text
from macspec.models.templates import encode_prompt, template_args

QWEN3 = json.loads((Path(__file__).parent / "fixtures/qwen3/tokenizer_config.json").read_text())
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]


def write_qwen3_tokenizer(folder: Path) -> None:
    """A byte-level tokenizer with Qwen3's special tokens and Qwen3's own chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(chars)}
    for j, special in enumerate(SPECIALS):
        vocab[special] = 256 + j
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<think>", "</think>"],
    )
    fast.chat_template = QWEN3["chat_template"]
    fast.save_pretrained(str(folder))


@pytest.fixture(scope="module")
def qwen_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("qwen3tok")
    write_qwen3_tokenizer(folder)
    return folder


@pytest.fixture(scope="module")
def tok(qwen_folder):
    return load_tokenizer(qwen_folder, eos_token_ids=[258])


# -- the template -----------------------------------------------------------------------------
@pytest.mark.parametrize("think", [None, True, False])
def test_think_flags_render_the_template_as_apply_chat_template_does(tok, think):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    got = encode_prompt(tok, "2+2?", system="Be brief.", args=template_args(think))
    extra = {} if think is None else {"enable_thinking": think}
    want = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **extra)
    assert got == list(want)
    text = tok.decode(got)
    assert text.endswith("<think>\n\n</think>\n\n") == (think is False)
    assert reasoning_start(tok, got) is False  # Qwen3 opens no block: the model writes <think>


def test_chat_template_args_json(tok):
    args = template_args(None, '{"enable_thinking": false}')
    assert args == {"enable_thinking": False}
    assert template_args(True, '{"enable_thinking": false, "x": 1}') == {
        "enable_thinking": True,
        "x": 1,
    }
    assert tok.decode(encode_prompt(tok, "hi", args=args)).endswith("</think>\n\n")


def test_a_template_that_opens_the_block_starts_inside(tok):
    ids = tok.encode("<|im_start|>assistant\n<think>\n", add_special_tokens=False)
    assert reasoning_start(tok, ids) is True


# -- splitting ----------------------------------------------------------------------------------
CASES = [
    (
        "<think>\nLet me add.\n2+2=4.\n</think>\n\nIt is 4.",
        False,
        ("Let me add.\n2+2=4.", "It is 4."),
    ),
    ("Let me add.\n</think>\n\nIt is 4.", True, ("Let me add.", "It is 4.")),
    ("It is 4, no thinking.", False, ("", "It is 4, no thinking.")),
    ("  <think>x</think>y", False, ("x", "y")),
    ("<thin k>", False, ("", "<thin k>")),
    ("<think>never closed", False, ("never closed", "")),
    ("a < b </ c </think", True, ("a < b </ c </think", "")),
]


@pytest.mark.parametrize(("text", "inside", "want"), CASES)
def test_the_split_does_not_depend_on_how_the_text_streams(text, inside, want):
    assert split_text(text, inside) == want
    rng = random.Random(0)
    for _ in range(30):  # arbitrary delta boundaries, tags cut anywhere
        splitter, pieces, at = ReasoningSplitter(inside), [], 0
        while at < len(text):
            size = rng.randint(1, 4)
            pieces.append(splitter.feed(text[at : at + size]))
            at += size
        pieces.append(splitter.flush())
        reasoning = "".join(p.reasoning for p in pieces).rstrip("\n")
        assert (reasoning, "".join(p.answer for p in pieces)) == want


def test_reasoning_is_dim_on_a_terminal_and_tagged_otherwise():
    for dim, opening, closing in [
        (True, "\x1b[2m", "\x1b[0m\n\n"),
        (False, "<think>\n", "\n</think>\n\n"),
    ]:
        stream = io.StringIO()
        writer, splitter = ReasoningWriter(stream, dim=dim), ReasoningSplitter()
        for delta in ["<think>hm", "m</th", "ink>\n\nyes"]:
            writer.write(splitter.feed(delta))
        writer.write(splitter.flush())
        writer.close()
        assert stream.getvalue() == f"{opening}hmm{closing}yes"


# -- end to end: a model that thinks ------------------------------------------------------------
class ScriptedModel(nn.Module):
    """Predicts a fixed continuation by position: a model that 'thinks' on cue."""

    def __init__(self, sequence: list[int], vocab: int):
        super().__init__()
        self.sequence, self.vocab = sequence, vocab
        self.layers = [nn.Identity()]

    def make_cache(self):
        return [KVCache()]

    def __call__(self, inputs: mx.array, cache=None):
        start, n = cache[0].offset, inputs.shape[1]
        cache[0].update_and_fetch(mx.zeros((1, 1, n, 1)), mx.zeros((1, 1, n, 1)))
        nxt = [self.sequence[min(p + 1, len(self.sequence) - 1)] for p in range(start, start + n)]
        return (mx.eye(self.vocab)[mx.array(nxt)] * 30.0)[None]


def thinking_engine(tok, prompt: list[int], answer: str, draft: bool = False) -> Engine:
    sequence = prompt + tok.encode(answer, add_special_tokens=False) + [258]
    target = ScriptedModel(sequence, 264)
    if not draft:
        return Engine(target, tok)
    from macspec.engine.drafters.model import ModelDrafter
    from macspec.engine.policy.length import FixedPolicy

    return Engine(target, tok, ModelDrafter(ScriptedModel(sequence, 264)), FixedPolicy(3))


ANSWER = "<think>\nThe user asks 2+2. That is 4.\n</think>\n\nIt is **4**."


@pytest.mark.parametrize("draft", [False, True])
def test_run_json_has_the_reasoning_apart(tok, qwen_folder, capsys, monkeypatch, draft):
    (qwen_folder / "config.json").write_text("{}")
    prompt = encode_prompt(tok, "2+2?")

    def fake_build(resolved, *args, **kwargs):
        return thinking_engine(tok, prompt, ANSWER, draft), type(
            "L", (), {"tokenizer": tok, "warnings": []}
        )

    monkeypatch.setattr("macspec.models.build.build_engine", fake_build)
    code = main(["run", "2+2?", "--model", str(qwen_folder), "--json", "--max-tokens", "200"])
    out, err = capsys.readouterr()
    assert code == 0, err
    record = json.loads(out)
    assert record["reasoning"] == "The user asks 2+2. That is 4."
    assert record["text"] == "It is **4**."
    assert record["stats"]["generated_tokens"] == len(record["tokens"])  # both parts counted
    code = main(["run", "2+2?", "--model", str(qwen_folder), "--max-tokens", "200"])
    out, _ = capsys.readouterr()
    assert out == "<think>\nThe user asks 2+2. That is 4.\n</think>\n\nIt is **4**.\n"


def test_max_tokens_counts_the_reasoning(tok):
    prompt = encode_prompt(tok, "2+2?")
    engine = thinking_engine(tok, prompt, ANSWER)
    done = list(engine.generate(prompt, GenerationConfig(max_tokens=12)))[-1]
    assert isinstance(done, Done) and done.finish_reason == "length" and len(done.tokens) == 12
    reasoning, answer = split_text(done.text)
    assert answer == "" and reasoning.startswith("The user")


def test_a_chat_stores_the_reasoning_apart(tok, tmp_path):
    from macspec.chat.session import ChatSession
    from macspec.chat.store import Store

    store = Store(tmp_path / "chats.db")
    prompt = encode_prompt(tok, "2+2?")
    chat = ChatSession(thinking_engine(tok, prompt, ANSWER), tok, store)
    events = list(chat.send("2+2?"))
    assert any(isinstance(e, Token) for e in events)
    stored = store.get(chat.conversation_id).messages[-1]
    assert stored.content == "It is **4**."
    assert stored.reasoning == "The user asks 2+2. That is 4."
    assert chat.messages[-1] == {"role": "assistant", "content": "It is **4**."}


@pytest.mark.asyncio
async def test_the_chat_shows_the_reasoning_collapsed_and_apart(tok, tmp_path):
    from test_tui import ask
    from textual.widgets import Collapsible

    from macspec.chat.store import Store
    from tui.factory import make_app

    store = Store(tmp_path / "chats.db")
    engine = thinking_engine(tok, encode_prompt(tok, "2+2?"), ANSWER, draft=True)
    app = make_app(engine, tok, store=store, config=GenerationConfig(max_tokens=200))
    async with app.run_test(size=(100, 30)) as pilot:
        answer = await ask(pilot, "2+2?")
        assert answer.text == "It is **4**."
        assert answer.reasoning.strip() == "The user asks 2+2. That is 4."
        section = answer.query_one(".reasoning", Collapsible)
        assert section.display and section.collapsed
        await pilot.press("ctrl+o")
        assert not section.collapsed
        conversation = app.session.conversation_id
    resumed = make_app(engine, tok, store=store, conversation_id=conversation)
    async with resumed.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        from tui.widgets.transcript import AnswerMessage

        old = resumed.transcript.query(AnswerMessage).last()
        assert old.text == "It is **4**." and old.reasoning == "The user asks 2+2. That is 4."
        assert old.query_one(".reasoning", Collapsible).collapsed


def test_think_and_system_that_the_template_cannot_use_are_named(tok):
    """A warning, not a silent no-op: --think needs a template that reads enable_thinking,
    --system a chat template at all."""
    from types import SimpleNamespace

    from macspec.models.templates import unused_template_options

    assert unused_template_options(tok, "be brief", True) == []  # Qwen3's template reads both
    plain = SimpleNamespace(has_chat_template=True, chat_template="{{ messages }}")
    assert unused_template_options(plain, "be brief", None) == []
    (warning,) = unused_template_options(plain, None, False)
    assert "no thinking switch: --no-think is not used" in warning
    bare = SimpleNamespace(has_chat_template=False)
    assert unused_template_options(bare, "be brief", True) == [
        "the model has no chat template: the prompt is fed raw (as with --raw); "
        "--system and --think are not used"
    ]
    assert unused_template_options(bare, None, False) == [
        "the model has no chat template: the prompt is fed raw (as with --raw); "
        "--no-think is not used"
    ]
    assert unused_template_options(bare, None, None) == [
        "the model has no chat template: the prompt is fed raw (as with --raw)"
    ]
