"""Structured outputs: the answer under a grammar is exactly the target alone's under the same
mask, whatever drafts.

The reference is mlx-lm's own decoding (`generate_step`) with a logits processor that masks
each step by an llguidance matcher of its own; seeded runs are checked against macspec's plain
constrained decoding with the same seed (the coupled sampler: the target's own seeded sample).
The demo pair drafts (a real BPE tokenizer, 2,048 ids).
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from llguidance import LLMatcher
from mlx_lm import load
from mlx_lm.generate import generate_step

import macspec
from macspec.engine.batch.engine import BatchEngine
from macspec.engine.core.config import GenerationConfig
from macspec.engine.core.events import Cycle, Done
from macspec.engine.core.grammar import Constraint, Grammar, ll_tokenizer
from macspec.engine.core.sampling import SamplingParams
from macspec.engine.drafters.lookup import HybridDrafter, LookupDrafter
from macspec.engine.drafters.model import ModelDrafter
from macspec.engine.generate.loop import Engine
from macspec.engine.policy.length import FixedPolicy
from macspec.errors import MacspecError

DEMO = Path(macspec.__file__).parent / "demo"
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "languages": {"type": "array", "items": {"enum": ["python", "c", "rust"]}},
    },
    "required": ["name", "age", "languages"],
    "additionalProperties": False,
}
GRAMMARS = {
    "schema": Grammar.json_schema(PERSON),
    "json": Grammar("json"),
    "regex": Grammar("regex", r"def [a-z_]{1,12}\(x\): return x [+*] [0-9]{1,3}"),
    "lark": Grammar("lark", 'start: "yes" | "no" | "maybe, " NUMBER\nNUMBER: /[0-9]+/'),
}
DRAFTERS = {
    "model": lambda draft: ModelDrafter(draft),
    "lookup": lambda draft: LookupDrafter(),
    "hybrid": lambda draft: HybridDrafter(ModelDrafter(draft)),
}


@pytest.fixture(scope="module")
def pair():
    target, tok = load(str(DEMO / "target"))
    draft, _ = load(str(DEMO / "draft"))
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "Write a Python function `add(x)`: Add one to x."}],
        add_generation_prompt=True,
    )
    return target, draft, tok, prompt


def mlx_lm_constrained_greedy(target, tok, prompt, grammar: Grammar, max_tokens: int):
    """mlx-lm's greedy decoding, each step masked by a matcher of its own."""
    matcher = LLMatcher(ll_tokenizer(tok), grammar.compiled())
    fed = []

    def mask(tokens: mx.array, logits: mx.array) -> mx.array:
        answer = tokens.tolist()[len(prompt) :]
        matcher.consume_tokens(answer[len(fed) :])
        fed[:] = answer
        bits = np.unpackbits(
            np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8), bitorder="little"
        )[: logits.shape[-1]].astype(bool)
        bits = np.pad(bits, (0, logits.shape[-1] - bits.size))
        return mx.where(mx.array(bits)[None], logits, -float("inf"))

    out = []
    steps = generate_step(
        mx.array(prompt), target, max_tokens=max_tokens, logits_processors=[mask],
        sampler=lambda logits: mx.argmax(logits, axis=-1),
    )  # fmt: skip
    for token, _ in steps:
        if int(token) in tok.eos_token_ids:
            break  # the end of sequence is not a token of the answer
        out.append(int(token))
    return out


def answer(engine: Engine, prompt, grammar, temperature=0.0, seed=None, max_tokens=48):
    config = GenerationConfig(
        max_tokens=max_tokens, grammar=grammar, sampling=SamplingParams(temperature), seed=seed
    )
    events = list(engine.generate(prompt, config))
    done = events[-1]
    assert isinstance(done, Done)
    return done, [e for e in events if isinstance(e, Cycle)]


@pytest.mark.parametrize("kind", list(GRAMMARS))
def test_greedy_equals_mlx_lm_under_the_same_mask(pair, kind):
    target, draft, tok, prompt = pair
    grammar = GRAMMARS[kind]
    reference = mlx_lm_constrained_greedy(target, tok, prompt, grammar, 48)
    plain, _ = answer(Engine(target, tok), prompt, grammar)
    assert plain.tokens == reference
    for name, make in DRAFTERS.items():
        done, cycles = answer(Engine(target, tok, make(draft), FixedPolicy(4)), prompt, grammar)
        assert done.tokens == reference, name
        assert sum(c.proposed for c in cycles) > 0, name


@pytest.mark.parametrize("kind", ["schema", "regex"])
@pytest.mark.parametrize("name", list(DRAFTERS))
def test_seeded_sampling_equals_plain_constrained_sampling(pair, kind, name):
    target, draft, tok, prompt = pair
    for seed in (1, 2):
        plain, _ = answer(Engine(target, tok), prompt, GRAMMARS[kind], 0.9, seed)
        engine = Engine(target, tok, DRAFTERS[name](draft), FixedPolicy(4))
        done, _ = answer(engine, prompt, GRAMMARS[kind], 0.9, seed)
        assert done.tokens == plain.tokens, (seed, done.text, plain.text)


def test_an_answer_that_ends_fits_its_schema(pair):
    """With room to finish, the answer is JSON that the schema accepts, and it ends there."""
    target, draft, tok, prompt = pair
    small = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "maximum": 99}},
        "required": ["ok", "n"],
        "additionalProperties": False,
    }
    engine = Engine(target, tok, ModelDrafter(draft), FixedPolicy(4))
    done, cycles = answer(engine, prompt, Grammar.json_schema(small), max_tokens=64)
    assert done.finish_reason == "stop", done.text
    value = json.loads(done.text)
    assert set(value) == {"ok", "n"} and isinstance(value["ok"], bool) and 0 <= value["n"] <= 99
    # The schema's fixed text ('{"ok":', ',"n":') is forced: guessed without a draft step.
    forced = [c for c in cycles if c.draft_source == "grammar"]
    assert forced and all(c.draft_steps == 0 and c.accepted >= 1 for c in forced)


def test_forced_ids_lift_tokens_per_pass_without_a_drafter(pair):
    target, _, tok, prompt = pair
    long_keys = {
        "type": "object",
        "properties": {"the_first_field_name": {"type": "integer"}, "and_the_second": {}},
        "required": ["the_first_field_name", "and_the_second"],
    }
    done, cycles = answer(Engine(target, tok), prompt, Grammar.json_schema(long_keys))
    assert len(done.tokens) / len(cycles) > 1.2  # forced keys come several per pass


def test_an_answer_cut_by_max_tokens_says_length(pair):
    target, draft, tok, prompt = pair
    engine = Engine(target, tok, ModelDrafter(draft), FixedPolicy(4))
    done, _ = answer(engine, prompt, GRAMMARS["schema"], max_tokens=5)
    assert done.finish_reason == "length" and len(done.tokens) == 5


@pytest.mark.parametrize(
    ("grammar", "says"),
    [
        (lambda: Grammar.json_schema({"type": "nosuch"}), "cannot be used"),
        (lambda: Grammar("json_schema", "{not json"), "not JSON"),
        (lambda: Grammar("json_schema", "[1, 2]"), "must be a JSON object"),
        (lambda: Grammar("regex", "(unclosed"), "cannot be used"),
        (lambda: Grammar("lark", "start: nosuchrule"), "cannot be used"),
        (lambda: Grammar("yaml", "a: b"), "one of"),
        (lambda: Grammar("regex", "a" * 300_000), "at most"),
    ],
)
def test_a_bad_grammar_is_one_clear_error(pair, grammar, says):
    _, _, tok, _ = pair
    with pytest.raises(MacspecError, match=says) as error:
        Constraint(grammar(), tok)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("name", ["model", "lookup"])
def test_batched_rows_under_grammars_are_each_request_alone(pair, name):
    """Rows with different grammars (and one without) share the batch's passes; each is the
    same request alone, greedy and seeded."""
    target, draft, tok, prompt = pair
    requests = [
        (GRAMMARS["schema"], 0.0, None),
        (None, 0.0, None),
        (GRAMMARS["regex"], 0.9, 3),
        (GRAMMARS["json"], 0.9, 5),
    ]
    configs = [
        GenerationConfig(max_tokens=24, grammar=g, sampling=SamplingParams(t), seed=s)
        for g, t, s in requests
    ]
    alone = [
        [e for e in Engine(target, tok).generate(prompt, c) if isinstance(e, Done)][0].tokens
        for c in configs
    ]
    engine = BatchEngine(target, tok, lambda: DRAFTERS[name](draft), lambda d: FixedPolicy(3))
    rows = []
    for config in configs:
        rows.append(engine.admit(prompt, config))
        while not engine.prefill_step(rows[-1], chunk=64):
            engine.step()
    while any(row.done is None for row in rows):
        engine.step()
    for row, want in zip(rows, alone):
        assert row.done.tokens == want
    assert max(row.done.stats.rows_per_pass for row in rows) > 1
    assert sum(row.done.stats.draft_accepted for row in rows) > 0
