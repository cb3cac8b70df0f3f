"""A real GGUF as a model: SmolLM2-135M-Instruct (Q4_1 layers, Q8_0 embeddings) read by macspec
answers as mlx-lm does on the same weights written as an mlx-lm folder, with every drafter,
and through `macspec run --model FILE.gguf`. Loaded once for the module."""

from __future__ import annotations

import json

import mlx.core as mx
import numpy as np
import pytest
from ggufkit import llama_reference_folder, smollm2_path
from losslesskit import reference
from mlx_lm.generate import generate_step
from mlx_lm.utils import load_model
from servekit import KEY, client

from macspec.cli import main
from macspec.engine.core.grammar import Grammar, ll_tokenizer
from macspec.engine.core.sampling import SamplingParams
from macspec.engine.generate.loop import Engine, GenerationConfig
from macspec.engine.policy.length import FixedPolicy
from macspec.models import hub
from macspec.models.build import build_engine, make_drafter
from macspec.models.catalog import ResolvedModels
from macspec.models.gguf.header import read_header
from macspec.models.gguf.layout import Layout
from macspec.models.gguf.tensors import read_tensors
from macspec.serve.backend import Backend
from macspec.serve.server import ServerThread

MAX_TOKENS = 6
QUESTION = "What is the capital of France?"
COPYING = "Say again: the red fox sees the blue bird, the red fox sees the blue bird"


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    """(derived folder, loaded models with SmolLM2 drafting for itself, reference model), under
    a macspec home of the module's own."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MACSPEC_HOME", str(tmp_path_factory.mktemp("home")))
        gguf = str(smollm2_path())
        folder = hub.local_model_path(gguf)
        assert hub.local_model_path(gguf) == folder  # derived once, then found by its hash
        resolved = ResolvedModels(folder, folder, gguf, gguf, None)
        engine, loaded = build_engine(resolved, "4", draft="model")
    expected = load_model(llama_reference_folder(smollm2_path(), tmp_path_factory.mktemp("ref")))
    return folder, engine, loaded, expected[0]


@pytest.fixture(scope="module")
def answers(smollm2) -> dict[str, list[int]]:
    """mlx-lm's greedy answer on the reference folder, per prompt, computed once."""
    _, _, loaded, expected = smollm2
    eos = loaded.tokenizer.eos_token_ids
    return {
        text: reference(expected, chat(loaded.tokenizer, text), MAX_TOKENS, eos=eos)
        for text in (QUESTION, COPYING)
    }


def chat(tokenizer, text: str, system: str = "Be brief.") -> list[int]:
    turns = [{"role": "system", "content": system}] if system else []
    turns.append({"role": "user", "content": text})
    return tokenizer.apply_chat_template(turns, add_generation_prompt=True)


def test_tokenizer_and_template_come_from_the_metadata(smollm2):
    folder, _, loaded, _ = smollm2
    tok = loaded.tokenizer
    config = json.loads((folder / "config.json").read_text())
    assert config["gguf"]["file"] == str(smollm2_path().resolve())
    ids = chat(tok, QUESTION, system="")
    text = tok.decode(ids)
    # The template of tokenizer.chat_template, with its default system turn; no BOS added.
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert text.endswith(f"<|im_start|>user\n{QUESTION}<|im_end|>\n<|im_start|>assistant\n")
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>") == 1
    assert tok.convert_tokens_to_ids("<|im_end|>") in tok.eos_token_ids
    for sample in ["naïve café 東京 😀", "def f(x):\n    return x**2  # 12345", "a  b\t\tc"]:
        assert tok.decode(tok.encode(sample)) == sample
        assert len(tok.encode(sample)) < len(sample.encode()) or sample.isascii()
    # Control tokens stay whole; digits are split one by one, as SmolLM2's own tokenizer does.
    assert tok.encode("<|im_end|>") == [2]
    assert len(tok.encode("12345")) == 5


def test_weights_are_mx_loads_bit_for_bit():
    header = read_header(smollm2_path())
    loaded, converted = mx.load(str(smollm2_path())), read_tensors(header, Layout.COMPACT)
    assert loaded.keys() == converted.keys()
    assert {t.qtype.name for t in header.tensors.values()} == {"F32", "Q4_1", "Q8_0"}
    for name, array in loaded.items():
        assert converted[name].dtype == array.dtype and mx.array_equal(converted[name], array), name


def test_logits_equal_the_mlx_lm_folders(smollm2):
    _, _, loaded, expected = smollm2
    ids = mx.array([chat(loaded.tokenizer, QUESTION)[:24]])
    ours, theirs = loaded.target(ids), expected(ids)
    assert mx.allclose(ours, theirs, atol=2e-3, rtol=1e-3)
    assert mx.array_equal(ours.argmax(-1), theirs.argmax(-1))


@pytest.mark.parametrize(
    "kind, text",
    [
        ("plain", QUESTION),
        ("lookup", COPYING),
        ("suffix", COPYING),
        ("model", QUESTION),
        ("hybrid", COPYING),
    ],
)
def test_greedy_answers_are_mlx_lms(smollm2, answers, kind, text):
    _, engine, loaded, _ = smollm2
    if kind != "model":
        drafter = None if kind == "plain" else make_drafter(kind, loaded)
        engine = Engine(
            loaded.target, loaded.tokenizer, drafter, FixedPolicy(4) if drafter else None
        )
    prompt = chat(loaded.tokenizer, text)
    done = list(engine.generate(prompt, GenerationConfig(max_tokens=MAX_TOKENS)))[-1]
    assert done.tokens == answers[text]
    if kind == "model":  # SmolLM2 drafting for itself: every guess is kept
        assert done.stats.draft_proposed > 0
        assert done.stats.draft_accepted == done.stats.draft_proposed


def test_seeded_sampling_with_drafters_is_plain_seeded_sampling(smollm2):
    """Seeded sampling (the coupled rule) with the draft model and with suffix decoding is the
    target alone's own seeded sample."""
    _, engine, loaded, _ = smollm2
    prompt = chat(loaded.tokenizer, COPYING)
    config = GenerationConfig(max_tokens=MAX_TOKENS, sampling=SamplingParams(0.8), seed=7)
    plain = list(Engine(loaded.target, loaded.tokenizer).generate(prompt, config))[-1].tokens
    suffix = Engine(loaded.target, loaded.tokenizer, make_drafter("suffix", loaded), FixedPolicy(4))
    for drafting in (engine, suffix):
        done = list(drafting.generate(prompt, config))[-1]
        assert done.tokens == plain and done.stats.draft_proposed > 0


def test_run_cli_answers_from_the_file(smollm2, answers, capsys):
    _, _, loaded, _ = smollm2
    args = ["run", "--model", str(smollm2_path()), "--max-tokens", str(MAX_TOKENS), "--json"]
    code = main([*args, "--system", "Be brief.", QUESTION])
    out, err = capsys.readouterr()
    assert code == 0, err
    record = json.loads(out)
    assert record["prompt_tokens"] == chat(loaded.tokenizer, QUESTION)
    assert record["tokens"] == answers[QUESTION]
    assert "Paris" in record["text"]


def test_serve_answers_the_openai_sdk(smollm2, answers):
    _, _, loaded, _ = smollm2
    engine = Engine(loaded.target, loaded.tokenizer, make_drafter("lookup", loaded), FixedPolicy(4))
    backend = Backend(engine, loaded.tokenizer, "smollm2", aliases=(str(smollm2_path()),), k=4)
    with ServerThread(backend, api_key=KEY) as server:
        reply = client(server).chat.completions.create(
            model=str(smollm2_path()),
            messages=[
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": QUESTION},
            ],
            max_tokens=MAX_TOKENS,
            temperature=0,
        )
    assert reply.choices[0].message.content == loaded.tokenizer.decode(answers[QUESTION])
    assert reply.usage.completion_tokens == len(answers[QUESTION])


PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
CITY = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "country": {"type": "string"},
        "population": {"type": "number"},
    },
    "required": ["city", "country", "population"],
    "additionalProperties": False,
}


def llguidance_greedy(loaded, prompt: list[int], schema: dict, options, max_tokens: int):
    """mlx-lm's own greedy loop (generate_step) with llguidance's mask as a logits processor,
    the grammar compiled by llguidance from `schema` with `options` (None: its defaults)."""
    from llguidance import LLMatcher

    tokenizer = loaded.tokenizer
    grammar = LLMatcher.grammar_from_json_schema(schema, defaults=options)
    matcher, fed = LLMatcher(ll_tokenizer(tokenizer), grammar), [len(prompt)]

    def mask(tokens: mx.array, logits: mx.array) -> mx.array:
        for token in tokens.tolist()[fed[0] :]:
            assert matcher.consume_token(token)
        fed[0] = len(tokens)
        bits = np.unpackbits(np.frombuffer(matcher.compute_bitmask(), np.uint8), bitorder="little")
        allowed = np.zeros(logits.shape[-1], bool)
        allowed[: min(len(bits), len(allowed))] = bits[: len(allowed)]
        return mx.where(mx.array(allowed), logits, -mx.inf)

    out = []
    steps = generate_step(mx.array(prompt), loaded.target, max_tokens=max_tokens,
                          logits_processors=[mask])  # fmt: skip
    for token, _ in steps:
        if int(token) in tokenizer.eos_token_ids:
            break
        out.append(int(token))
    return out


@pytest.mark.parametrize(
    "schema,ask",
    [(PERSON, "Alice is 30 years old. Give her as JSON."), (CITY, "Paris, France: as JSON.")],
)
def test_constrained_ids_are_llguidances_with_macspecs_json_options(smollm2, schema, ask):
    """macspec's JSON grammar is llguidance's with `{"whitespace_flexible": false}` (compact
    JSON, see docs/structured-outputs.md): mlx-lm + llguidance given that option answers the
    same ids, drafted or not. With llguidance's defaults (any whitespace) SmolLM2 writes
    pretty-printed JSON instead, which is the whole difference."""
    _, engine, loaded, _ = smollm2
    prompt = chat(loaded.tokenizer, ask, system="")
    config = GenerationConfig(max_tokens=24, grammar=Grammar.json_schema(schema))
    done = list(engine.generate(prompt, config))[-1]
    assert done.stats.draft_proposed > 0
    compact = llguidance_greedy(loaded, prompt, schema, {"whitespace_flexible": False}, 24)
    assert done.tokens == compact
    assert loaded.tokenizer.decode(compact).startswith('{"')
    flexible = llguidance_greedy(loaded, prompt, schema, None, 6)  # its start is the point
    assert loaded.tokenizer.decode(flexible).startswith('{\n  "')
