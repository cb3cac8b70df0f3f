"""Gemma 3 270M base as people have it: one Q4_K_M GGUF (Q4_K and Q5_0 layers exact as MLX
affine weights, Q6_K kept as float16, Q8_0 embeddings), read where it lies. Its greedy raw
continuations equal those of the same file dequantized to float32 by gguf and run through
mlx-lm's own gemma3_text; with prompt lookup and suffix decoding, greedy and seeded, it is the
target alone. Loaded once for the module (about 4 tokens/s here: the answers stay short)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from gguf import quants
from kquantkit import gemma_q4_k_m
from losslesskit import reference
from mlx_lm.utils import load_model

from macspec.engine.core.sampling import SamplingParams
from macspec.engine.drafters.lookup import LookupDrafter
from macspec.engine.drafters.suffix import SuffixDrafter
from macspec.engine.generate.loop import Engine, GenerationConfig
from macspec.engine.policy.length import FixedPolicy
from macspec.models import hub
from macspec.models.build import build_engine
from macspec.models.catalog import ResolvedModels
from macspec.models.gguf.config import to_mlx
from macspec.models.gguf.header import read_header
from macspec.models.gguf.tensors import exactness

PROMPTS = ["The capital of France is", "def fibonacci(n):\n    "]
AGREE = 8
"""Greedy tokens in which the exact conversion agrees with the float32 reference on these
prompts (the matmuls round differently: quantized against float weights)."""
REPEATING = "one two three, one two three, one two three, one two"


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    """(file, derived folder, engine with no drafter, tokenizer)."""
    path = gemma_q4_k_m(tmp_path_factory.mktemp("gemma"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MACSPEC_HOME", str(tmp_path_factory.mktemp("home")))
        folder = hub.local_model_path(str(path))
        resolved = ResolvedModels(folder, None, str(path), None, None)
        engine, loaded = build_engine(resolved, None, no_draft=True)
    return path, folder, engine, loaded.tokenizer


@pytest.fixture(scope="module")
def float_reference(gemma):
    """mlx-lm's gemma3_text with every tensor as gguf dequantizes it, in float32."""
    path, folder, _, _ = gemma
    header = read_header(path)
    weights = {}
    with open(path, "rb") as file:
        for tensor in header.tensors.values():
            file.seek(tensor.start)
            raw = np.frombuffer(file.read(tensor.nbytes), np.uint8)
            values = quants.dequantize(raw, tensor.qtype).astype(np.float32)
            weights[tensor.name] = mx.array(values.reshape(tensor.shape))
    model, config = load_model(folder, lazy=True, strict=False)
    model.load_weights(list(to_mlx(header, config, weights).items()), strict=True)
    mx.eval(model.parameters())
    return model


def test_the_tensors_convert_exactly_where_the_format_allows(gemma):
    path = gemma[0]
    exact, inexact = exactness(read_header(path))
    assert set(exact) == {"F32", "Q4_K", "Q5_0", "Q8_0"} and set(inexact) == {"Q6_K"}
    assert sum(exact.values()) + sum(inexact.values()) == 236


def test_greedy_continuations_equal_the_float_reference(gemma, float_reference):
    _, _, engine, tokenizer = gemma
    for text in PROMPTS:
        prompt = tokenizer.encode(text)
        assert prompt[0] == tokenizer.bos_token_id  # a base model's raw prompt: BOS, then text
        done = list(engine.generate(prompt, GenerationConfig(max_tokens=AGREE)))[-1]
        want = reference(float_reference, prompt, AGREE, eos=tokenizer.eos_token_ids)
        assert done.tokens == want, (text, tokenizer.decode(done.tokens), tokenizer.decode(want))


def test_drafters_are_the_target_alone(gemma):
    """Prompt lookup greedy, suffix decoding seeded: each the target alone's answer."""
    _, _, engine, tokenizer = gemma
    prompt = tokenizer.encode(REPEATING)
    cases = [
        (LookupDrafter(), GenerationConfig(max_tokens=8)),
        (SuffixDrafter(), GenerationConfig(max_tokens=8, sampling=SamplingParams(0.8), seed=4)),
    ]
    for guesser, config in cases:
        want = list(engine.generate(prompt, config))[-1].tokens
        drafting = Engine(engine.target.model, tokenizer, guesser, FixedPolicy(4))
        done = list(drafting.generate(prompt, config))[-1]
        assert done.tokens == want, guesser.name
        assert done.stats.draft_proposed > 0, guesser.name  # the repetition was guessed
