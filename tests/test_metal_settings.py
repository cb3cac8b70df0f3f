"""What decides speed on Metal, checked without a Mac: the wired limit, prefill chunks and
MLX's buffer cache, a quantized KV cache that rolls back, and a policy on Apple GPUs' curves."""

from __future__ import annotations

import mlx.core as mx
import pytest
import tiny
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import QuantizedKVCache

from macspec.engine.caches import cached as cached_module
from macspec.engine.caches.cached import CachedModel, CacheOptions
from macspec.engine.core import wired as wired_module
from macspec.engine.core.cycle import Cycle
from macspec.engine.core.events import Token
from macspec.engine.drafters.model import ModelDrafter
from macspec.engine.generate.loop import CLEAR_CACHE_EVERY, Engine, GenerationConfig
from macspec.engine.policy.length import AutoPolicy, FixedPolicy
from macspec.errors import MacspecError

EOS = 257


@pytest.fixture(scope="module")
def pair():
    target = tiny.random_model(0, scale=3.0)
    return target, tiny.noisy_copy(target, 0.02, seed=1)


# -- the wired limit -----------------------------------------------------------------------------
class FakeMetal:
    """A device that reports a recommended working set; records limit changes and passes."""

    def __init__(self, monkeypatch):
        self.log: list[str] = []
        self.limit = 111
        monkeypatch.setattr(mx, "device_info", lambda: {"max_recommended_working_set_size": 999})

        def set_wired_limit(value):
            old, self.limit = self.limit, value
            self.log.append(f"wired {value}")
            return old

        monkeypatch.setattr(mx, "set_wired_limit", set_wired_limit)
        monkeypatch.setattr(mx, "synchronize", lambda *a: self.log.append("synchronize"))
        forward = CachedModel.forward
        monkeypatch.setattr(
            CachedModel, "forward", lambda m, ids: self.log.append("forward") or forward(m, ids)
        )


@pytest.mark.parametrize("ending", ["normal", "cancel", "close", "error"])
def test_the_wired_limit_is_set_first_and_restored_however_it_ends(tok, pair, monkeypatch, ending):
    metal = FakeMetal(monkeypatch)
    target, draft = pair
    engine = Engine(target, tok, ModelDrafter(draft), FixedPolicy(3))
    prompt = tok.encode("hello there")
    config = GenerationConfig(max_tokens=12)
    if ending == "error":
        monkeypatch.setattr(
            engine.target, "trim_to", lambda *a: (_ for _ in ()).throw(RuntimeError("boom"))
        )
        with pytest.raises(RuntimeError, match="boom"):
            list(engine.generate(prompt, config))
    elif ending == "close":
        events = engine.generate(prompt, config)
        next(e for e in events if isinstance(e, Token))
        events.close()
    else:
        stop = ending == "cancel"
        list(engine.generate(prompt, config, cancelled=lambda: stop))
    assert metal.log[0] == "wired 999"  # before the first forward pass
    assert metal.log[-2:] == ["synchronize", "wired 111"]  # synchronized, then restored
    assert metal.limit == 111


def test_off_metal_the_wired_limit_is_left_alone(tok, pair, monkeypatch):
    calls = []
    monkeypatch.setattr(mx, "set_wired_limit", lambda v: calls.append(v) or 0)
    with wired_module.wired_limit():
        pass
    assert calls == []  # the CPU backend reports no recommended working set


# -- prefill and MLX's buffer cache --------------------------------------------------------------
def test_prefill_goes_in_chunks_and_empties_the_buffer_cache(tok, pair, monkeypatch):
    target, _ = pair
    widths, cleared = [], []
    forward = CachedModel.forward
    monkeypatch.setattr(
        CachedModel, "forward", lambda m, ids: widths.append(len(ids)) or forward(m, ids)
    )
    monkeypatch.setattr(mx, "clear_cache", lambda: cleared.append(len(widths)))
    engine = Engine(target, tok)
    prompt = list(range(50)) * 3  # 150 ids
    config = GenerationConfig(max_tokens=2, prefill_step_size=64)
    list(engine.generate(prompt, config))
    assert widths[:3] == [64, 64, 21]  # the prompt but its last id, 64 at a time
    assert cleared[:3] == [1, 2, 3]  # after each chunk
    assert cached_module.PREFILL_CHUNK == 2048  # the default, as mlx-lm's


def test_the_buffer_cache_is_emptied_every_few_hundred_tokens(tok, pair, monkeypatch):
    target, draft = pair
    cleared = []
    monkeypatch.setattr(mx, "clear_cache", lambda: cleared.append(1))
    engine = Engine(target, tok, ModelDrafter(draft), FixedPolicy(3))
    tiny_eos = tok.encode("x")  # noqa: F841 - any prompt; EOS is unlikely in 600 tokens
    done = list(
        engine.generate(tok.encode("go"), GenerationConfig(max_tokens=2 * CLEAR_CACHE_EVERY + 10))
    )[-1]
    decoded = len(done.tokens)
    assert len(cleared) >= 2 + decoded // CLEAR_CACHE_EVERY - 1  # prefills, then every 256


# -- a quantized KV cache ------------------------------------------------------------------------
def test_kv_bits_8_is_mlx_lms_greedy_with_the_same_quantization(tok):
    target = tiny.random_model(0, tiny.model_args(hidden=128, heads=4, kv_heads=2), scale=3.0)
    draft = tiny.noisy_copy(target, 0.02, seed=1)  # head_dim 32: one quantization group
    options = CacheOptions(kv_bits=8, kv_group_size=32, quantized_kv_start=0)
    drafter = ModelDrafter(draft, options=options)
    engine = Engine(target, tok, drafter, FixedPolicy(3), cache_options=options)
    for text in ["hello world", "The quick brown fox jumps over", "def f(x):"]:
        prompt = tok.encode(text)
        want = []
        for token, _ in generate_step(
            mx.array(prompt),
            target,
            max_tokens=24,
            kv_bits=8,
            kv_group_size=32,
            quantized_kv_start=0,
        ):
            if token == EOS:
                break
            want.append(token)
        done = list(engine.generate(prompt, GenerationConfig(max_tokens=24)))[-1]
        assert done.tokens == want
        assert all(isinstance(c, QuantizedKVCache) for c in engine.target.cache)
        assert done.stats.draft_accepted < done.stats.draft_proposed  # rollbacks happened


def mlx_lm_greedy(target, ids, cache, bits: int, max_tokens: int = 24) -> list[int]:
    said = []
    for token, _ in generate_step(
        mx.array(ids), target, max_tokens=max_tokens, prompt_cache=cache,
        kv_bits=bits, kv_group_size=32, quantized_kv_start=0,
    ):  # fmt: skip
        if token == EOS:
            break
        said.append(token)
    return said


@pytest.mark.parametrize("bits", [8, 4])
def test_a_reused_prefix_of_a_quantized_cache_is_mlx_lms_answer_on_the_same_cache(tok, bits):
    """A second prompt sharing a prefix with the first is answered from the first one's
    quantized cache, trimmed to the shared ids: its new ids attend to the prefix's quantized
    keys, where a cold prefill of the whole prompt attends to them in full precision (so the
    two answers may differ: with 4 bits they mostly do). mlx-lm's generate_step on the same
    trimmed cache gives the answer macspec gives, speculating or not."""
    from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

    target = tiny.random_model(0, tiny.model_args(hidden=128, heads=4, kv_heads=2), scale=3.0)
    draft = tiny.noisy_copy(target, 0.02, seed=1)
    options = CacheOptions(kv_bits=bits, kv_group_size=32, quantized_kv_start=0)
    plain = Engine(target, tok, cache_options=options)
    drafted = Engine(
        target, tok, ModelDrafter(draft, options=options), FixedPolicy(3), cache_options=options
    )
    first = tok.encode("The quick brown fox jumps over the lazy dog")
    for tail in [" and the cat", " twice, then sleeps", ". def f(x): return x"]:
        second = first + tok.encode(tail)
        cache = make_prompt_cache(target)
        mlx_lm_greedy(target, first, cache, bits)
        trim_prompt_cache(cache, cache[0].offset - len(first))  # back to `first`
        want = mlx_lm_greedy(target, second[len(first) :], cache, bits)
        for engine in (plain, drafted):
            list(engine.generate(first, GenerationConfig(max_tokens=24)))
            done = list(engine.generate(second, GenerationConfig(max_tokens=24)))[-1]
            assert done.stats.cached_tokens == len(first)
            assert done.tokens == want


@pytest.mark.parametrize("bad", [dict(kv_bits=3), dict(kv_group_size=48), dict(max_kv_size=0)])
def test_bad_cache_options_are_user_errors(bad):
    with pytest.raises(MacspecError):
        CacheOptions(**bad)


def test_max_kv_size_keeps_a_window_and_stays_exact(tok, pair):
    target, draft = pair
    options = CacheOptions(max_kv_size=16)
    engine = Engine(
        target, tok, ModelDrafter(draft, options=options), FixedPolicy(3), cache_options=options
    )
    prompt = tok.encode("The quick brown fox jumps over the lazy dog")
    want = []
    for token, _ in generate_step(mx.array(prompt), target, max_tokens=30, max_kv_size=16):
        if token == EOS:
            break
        want.append(token)
    assert list(engine.generate(prompt, GenerationConfig(max_tokens=30)))[-1].tokens == want


# -- the policy on Apple GPUs' cost curves -------------------------------------------------------
def policy_on(curve, acceptance: float, draft_cost: float = 0.05, cycles: int = 300) -> AutoPolicy:
    """An AutoPolicy fed cycles timed by `curve(m)` seconds for a pass over m ids, each guess
    kept with `acceptance`: what it settles on."""
    policy = AutoPolicy(max_k=8)
    rng = __import__("random").Random(0)
    for _ in range(cycles):
        k = policy.draft_length()
        kept = 0
        while kept < k and rng.random() < acceptance:
            kept += 1
        policy.observe(
            Cycle(k, k, kept, k * draft_cost, curve(k + 1), 0.0, k, k, "model", fed=k + 1)
        )
    return policy


@pytest.mark.parametrize("acceptance", [0.6, 0.8])
def test_on_an_m1_like_curve_auto_guesses_little_or_nothing(acceptance):
    """M1/M2: T(m)/T(1) rises about 0.35 per id (1.7-2.5x at m = 2-5): k <= 2 or plain."""
    policy = policy_on(lambda m: 1.0 + 0.35 * (m - 1), acceptance)
    assert policy.best_k() <= 2


def test_on_an_m3_like_curve_auto_guesses_more():
    """M3 and later with MLX 0.32: about 1.1-1.4x at m = 2-5: longer drafts pay."""
    policy = policy_on(lambda m: 1.0 + 0.08 * (m - 1), 0.8)
    assert policy.best_k() >= 3


# -- start-up: tokenizers scanned once, then not at all ------------------------------------------
def test_a_pair_load_scans_each_tokenizer_once_then_never(tmp_path, monkeypatch):
    """The compatibility check reads each vocabulary once (mlx-lm's own loading reads the
    target's too, which no flag avoids); with the fingerprints cached under the home, keyed by
    the files' hashes, it reads none, and the draft's tokenizer is not even loaded."""
    from macspec.models import loader, tokenizers
    from macspec.models.loader import load_models

    monkeypatch.setenv("MACSPEC_HOME", str(tmp_path / "home"))
    target = tiny.random_model(0)
    # The same vocabulary in files that differ (no chat template): both tokenizers are read.
    folders = [
        tiny.save_model(target, tmp_path / "t"),
        tiny.save_model(tiny.random_model(1), tmp_path / "d", chat_template=False),
    ]
    scans, draft_loads = [], []
    compute, load_draft = tokenizers.compute, loader.draft_tokenizer
    monkeypatch.setattr(tokenizers, "compute", lambda tok: scans.append(1) or compute(tok))

    def counted(path, role="draft model"):
        draft_loads.append(path)
        return load_draft(path, role)

    monkeypatch.setattr(loader, "draft_tokenizer", counted)
    load_models(*folders)
    assert len(scans) == 2 and draft_loads.count(folders[1]) == 1  # once per tokenizer
    scans.clear(), draft_loads.clear()
    load_models(*folders)
    assert scans == [] and folders[1] not in draft_loads
    mismatched = tiny.save_model(tiny.random_model(2), tmp_path / "other", tokenizer_shift=7)
    with pytest.raises(MacspecError, match="tokenizers differ"):
        load_models(folders[0], mismatched)


def test_a_pair_larger_than_the_working_set_gets_a_one_line_warning(tmp_path, monkeypatch):
    from macspec.models.build import build_engine
    from macspec.models.catalog import ResolvedModels

    folder = tiny.save_model(tiny.random_model(0), tmp_path / "t")
    resolved = ResolvedModels(folder, None, "t", None, None)
    monkeypatch.setattr(mx, "device_info", lambda: {"max_recommended_working_set_size": 10**9})
    assert build_engine(resolved)[1].warnings == []
    monkeypatch.setattr(mx, "device_info", lambda: {"max_recommended_working_set_size": 1000})
    warnings = build_engine(resolved)[1].warnings
    assert len(warnings) == 1 and "exceed the 0.0 GB this GPU may wire" in warnings[0]


def test_kv_estimates_know_hybrid_and_sliding_layers():
    from macspec.models.memory import kv_cache_bytes

    dense = dict(num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2, head_dim=64)
    full = kv_cache_bytes(dense, 1000)
    assert full == 2 * 8 * 2 * 64 * 1000 * 2
    assert kv_cache_bytes({**dense, "full_attention_interval": 4}, 1000) == full // 4
    gemma = {**dense, "sliding_window": 100, "sliding_window_pattern": 4}
    assert kv_cache_bytes(gemma, 1000) == full // 8 * (2 * 1000 + 6 * 100) // 1000
    assert kv_cache_bytes({**dense, "model_type": "mamba2"}, 1000) == 0
