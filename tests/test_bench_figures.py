"""`macspec bench`'s figures: arithmetic, mlx-lm's replayed cycles, losslessness, planning."""

from __future__ import annotations

import pytest
from mlx_lm import stream_generate
from mlx_lm.models import llama
from tiny import model_args, noisy_copy, random_model, save_model, tokenizer

from macspec.bench.figures import (
    MACSPEC,
    MLX_LM,
    BenchConfig,
    RunRecord,
    replay_mlx_cycles,
    spread,
    summarize,
)
from macspec.bench.lossless import (
    compare,
    first_difference,
    lossless_checks,
    summarize_lossless,
)
from macspec.bench.plan import BenchSettings, plan_configs, schedule
from macspec.bench.prompts import builtin, load_prompts
from macspec.bench.theory import (
    CostCurve,
    best_k,
    predicted_best_k,
    predicted_speedup,
    predicted_tokens_per_pass,
    theory_rows,
)
from macspec.errors import MacspecError

PLAIN0 = BenchConfig(MACSPEC, None, 0.0)
MLX0 = BenchConfig(MLX_LM, None, 0.0)
K2 = BenchConfig(MACSPEC, "2", 0.0)


def record(
    config,
    prompt=0,
    repeat=0,
    tokens=(1, 2, 3, 4),
    arrivals=None,
    passes=4,
    proposed=0,
    accepted=0,
    rejections=0,
    first=1,
    peak=0,
) -> RunRecord:
    arrivals = (
        arrivals if arrivals is not None else tuple(0.1 * (i + 1) for i in range(len(tokens)))
    )
    return RunRecord(
        config,
        prompt,
        repeat,
        tuple(tokens),
        "length",
        tuple(arrivals),
        arrivals[-1] if arrivals else 0.0,
        first,
        passes,
        proposed,
        accepted,
        rejections,
        peak,
    )


# -- arithmetic -----------------------------------------------------------------------------
def test_decode_rate_starts_after_the_first_pass():
    run = record(K2, tokens=(1, 2, 3, 4, 5), arrivals=(0.5, 0.5, 0.6, 0.7, 0.8), first=2)
    assert run.ttft_s == 0.5
    assert run.decode_tokens_per_s == pytest.approx(3 / 0.3)
    assert record(K2, tokens=(1,), arrivals=(0.2,)).decode_tokens_per_s is None


def test_spread_quartiles_and_median():
    s = spread([4.0, None, 1.0, 3.0, 2.0, 5.0])
    assert (s.median, s.q1, s.q3, s.low, s.high, s.count) == (3.0, 2.0, 4.0, 1.0, 5.0, 5)
    assert spread([None]) is None
    assert spread([2.0]).q1 == spread([2.0]).q3 == 2.0


def test_summary_pools_counts_and_pairs_speedups():
    # Baseline: 10 tok/s on prompt 0, 20 on prompt 1 (4 ids, 1 per pass, 0.1 s or 0.05 s apart).
    base = [record(PLAIN0, 0), record(PLAIN0, 1, arrivals=(0.05, 0.1, 0.15, 0.2))]
    # k=2: prompt 0 at 15 tok/s (1.5x), prompt 1 at 20 tok/s (1.0x).
    spec = [
        record(
            K2,
            0,
            tokens=(1, 2, 3, 4, 5, 6, 7),
            arrivals=(0.2, 0.4, 0.4, 0.4, 0.6, 0.6, 0.6),
            passes=3,
            proposed=6,
            accepted=4,
            rejections=1,
            first=1,
            peak=7,
        ),
        record(
            K2,
            1,
            tokens=(1, 2, 3),
            arrivals=(0.1, 0.15, 0.2),
            passes=3,
            proposed=6,
            accepted=0,
            rejections=3,
            first=1,
            peak=9,
        ),
    ]
    summaries = {s.config: s for s in summarize(base + spec)}
    s = summaries[K2]
    assert s.runs == 2 and s.generated_tokens == 10 and s.passes == 6
    assert s.acceptance_rate == pytest.approx(4 / 12)
    assert s.judged_acceptance == pytest.approx(4 / (4 + 4))
    assert s.tokens_per_pass == pytest.approx(10 / 6)
    assert s.wasted == 8 and s.draft_length == 2.0 and s.peak_memory_bytes == 9
    assert s.decode_tokens_per_s.median == pytest.approx(17.5)  # 15 and 20
    assert s.speedup.median == pytest.approx(1.25)  # 1.5 and 1.0, paired per prompt
    assert s.speedup_of_medians == pytest.approx(17.5 / 15)
    assert s.ttft_s.median == pytest.approx(0.15)
    b = summaries[PLAIN0]
    assert b.speedup.median == 1.0 and b.acceptance_rate is None and b.wasted == 0


def test_theory_formula():
    assert predicted_tokens_per_pass(0.5, 2) == pytest.approx(1.75)
    assert predicted_tokens_per_pass(1.0, 3) == 4.0
    # GPU-like curve: flat; c = 0.1 -> 1.75 / (0.2 + 1)
    assert predicted_speedup(0.5, 2, 0.1, [1, 1, 1]) == pytest.approx(1.75 / 1.2)
    # CPU-like curve: T(m) = m T(1): speculation never pays.
    assert predicted_best_k(0.9, 0.1, [1, 2, 3, 4, 5]) == (0, 1.0)
    k, speedup = predicted_best_k(0.8, 0.05, [1.0] * 9)
    assert k > 2 and speedup == pytest.approx(predicted_speedup(0.8, k, 0.05, [1.0] * 9))


def test_theory_rows_and_best_k_use_judged_acceptance():
    curve = CostCurve(target_s=(0.01, 0.01, 0.01, 0.01), draft_s=0.001)
    assert curve.relative == (1.0, 1.0, 1.0, 1.0) and curve.draft_cost == pytest.approx(0.1)
    runs = [
        record(PLAIN0),
        record(K2, tokens=(1,) * 6, passes=3, proposed=6, accepted=3, rejections=3, first=2),
    ]
    rows = theory_rows(summarize(runs), curve)
    assert len(rows) == 1 and rows[0].alpha == 0.5
    assert rows[0].predicted_speedup == pytest.approx(1.75 / 1.2)
    assert rows[0].measured_tokens_per_pass == 2.0
    (best,) = best_k(summarize(runs), curve)
    assert best.alpha == 0.5 and best.predicted_k == 2  # k=3 would need T(4)


def test_theory_prices_lookup_guesses_by_the_lookup_not_the_draft_model():
    # CPU-like curve (T(m) = m T(1)) and a draft step of half a target pass
    curve = CostCurve(target_s=(0.01, 0.02, 0.03, 0.04), draft_s=0.005, lookup_s=1e-5)
    assert curve.lookup_cost == pytest.approx(0.001)
    mlx_k2 = BenchConfig(MLX_LM, "2", 0.0)
    runs = [
        record(PLAIN0),
        record(K2, tokens=(1,) * 6, passes=3, proposed=6, accepted=3, rejections=3, first=2),
        record(mlx_k2, tokens=(1,) * 6, passes=3, proposed=6, accepted=3, rejections=3, first=2),
    ]
    by_config = {r.config: r for r in theory_rows(summarize(runs), curve, "lookup")}
    # macspec drafts by lookup: c is the lookup's; mlx-lm always drafts with its model.
    assert by_config[K2].c == pytest.approx(0.001)
    assert by_config[K2].predicted_speedup == pytest.approx(1.75 / (2 * 0.001 + 3))
    assert by_config[mlx_k2].c == pytest.approx(0.5)
    assert by_config[mlx_k2].predicted_speedup == pytest.approx(1.75 / (2 * 0.5 + 3))
    # A hybrid is priced as its draft model (an upper bound).
    (hybrid,) = [r for r in theory_rows(summarize(runs), curve, "hybrid") if r.config == K2]
    assert hybrid.c == pytest.approx(0.5)
    # On a flat (GPU-like) curve free guesses make speculation pay even at modest acceptance
    flat = CostCurve(target_s=(0.01,) * 4, draft_s=0.005, lookup_s=1e-5)
    (best,) = best_k(summarize(runs), flat, "lookup")
    assert best.predicted_k == 3 and best.predicted_speedup == pytest.approx(1.875 / 1.003)
    (best_model,) = best_k(summarize(runs), flat, "model")
    assert (best_model.predicted_k, best_model.predicted_speedup) == (0, 1.0)


# -- mlx-lm's cycles --------------------------------------------------------------------------
def test_replay_counts_proposals_from_flags():
    flags = [True, True, False, True, True, True, False, False]
    c = replay_mlx_cycles(flags, k=3, max_tokens=100, delivered=8)
    assert (c.passes, c.proposed, c.accepted, c.rejections, c.first_pass_tokens) == (3, 9, 5, 2, 3)
    # Cut by max_tokens: the second cycle drafts only the 1 id still allowed, no target id.
    c = replay_mlx_cycles([True, True, True, False, True], k=3, max_tokens=5, delivered=5)
    assert (c.passes, c.proposed, c.accepted, c.rejections) == (2, 4, 4, 0)
    # k = 0: plain decoding, a pass per id (the end-of-sequence id included).
    c = replay_mlx_cycles([False] * 4, k=0, max_tokens=10, delivered=3)
    assert (c.passes, c.proposed, c.first_pass_tokens) == (4, 0, 1)


@pytest.fixture(scope="module")
def pair():
    target = random_model(0, model_args(), scale=3.0)
    return target, noisy_copy(target, 0.02, 1)


def test_replay_matches_the_passes_mlx_lm_really_runs(pair, tmp_path, monkeypatch):
    """Count the target's forward passes and their widths inside mlx-lm itself."""
    target, draft = pair
    tok = tokenizer(save_model(target, tmp_path / "t"))
    widths: list[int] = []
    original = llama.Model.__call__

    def counting(self, inputs, *args, **kwargs):
        if self is target:
            widths.append(inputs.shape[1])
        return original(self, inputs, *args, **kwargs)

    monkeypatch.setattr(llama.Model, "__call__", counting)
    prompt = tok.encode("Hello there, how are you?")
    for k, max_tokens in ((3, 40), (2, 7)):
        widths.clear()
        flags, delivered = [], 0
        for r in stream_generate(
            target, tok, prompt, max_tokens=max_tokens, draft_model=draft, num_draft_tokens=k
        ):
            flags.append(r.from_draft)
            delivered += r.finish_reason != "stop"
        decode = widths[1:]  # the first call prefills all but the last prompt id
        c = replay_mlx_cycles(flags, k, max_tokens, delivered)
        assert c.passes == len(decode)
        assert c.proposed == sum(w - 1 for w in decode)
        assert 0 < c.accepted <= c.proposed


# -- losslessness -----------------------------------------------------------------------------
def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


def test_a_perturbed_run_is_reported_not_lossless():
    plain, mlx = record(PLAIN0, tokens=(5, 6, 7, 8)), record(MLX0, tokens=(5, 6, 7, 8))
    spec = record(K2, tokens=(5, 6, 7, 9))
    short = record(BenchConfig(MACSPEC, "auto", 0.0), tokens=(5, 6))
    sampled = record(BenchConfig(MACSPEC, "2", 0.7), tokens=(1,))  # never checked at T > 0
    checks = lossless_checks([plain, mlx, spec, short, sampled])
    assert {(c.config.name, c.reference.name) for c in checks} == {
        ("macspec plain", "mlx-lm plain"),
        ("macspec k=2", "macspec plain"),
        ("macspec k=2", "mlx-lm plain"),
        ("macspec auto", "macspec plain"),
        ("macspec auto", "mlx-lm plain"),
    }
    bad = compare(spec, plain)
    assert not bad.identical and (bad.position, bad.got, bad.expected) == (3, 9, 8)
    ended = compare(short, plain)
    assert (ended.position, ended.got, ended.expected, ended.lengths) == (2, None, 7, (2, 4))
    groups = {(g.config.name, g.reference.name): g for g in summarize_lossless(checks)}
    assert groups[("macspec plain", "mlx-lm plain")].identical == 1
    assert groups[("macspec k=2", "macspec plain")].differences[0].position == 3


# -- planning ---------------------------------------------------------------------------------
def test_plan_and_rotating_schedule():
    settings = BenchSettings(ks=(2, 3), temperature=0.5)
    configs = plan_configs(settings)
    # per temperature: plain x2, mlx-lm k x2, macspec k x2, auto x2; at T > 0 the rejection
    # rule's k x2 too
    assert len(configs) == 2 * (2 + 2 + 2 + 2) + 2 and len(set(configs)) == len(configs)
    assert {c.name for c in configs if c.k is None} >= {"macspec auto", "macspec auto-warm"}
    order = schedule(configs, prompts=3, repeats=2)
    assert len(order) == 2 * 3 * len(configs)
    for repeat in range(2):
        for prompt in range(3):
            block = [c for r, p, c in order if (r, p) == (repeat, prompt)]
            assert sorted(block, key=configs.index) == configs
    firsts = [order[i * len(configs)][2] for i in range(6)]
    assert len(set(firsts)) == 6  # a different configuration opens each prompt
    with pytest.raises(MacspecError):
        BenchSettings(temperature=0)


def test_prompt_files(tmp_path):
    assert {p.category for p in builtin()} == {"chat", "code", "summary", "writing"}
    assert len(builtin(quick=True)) == 4
    lines = tmp_path / "p.txt"
    lines.write_text("first prompt\n\nsecond prompt\n")
    assert [p.text for p in load_prompts(lines)] == ["first prompt", "second prompt"]
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"prompt": "a", "name": "x"}\n{"prompt": "b"}\n')
    assert [(p.name, p.text) for p in load_prompts(jsonl)] == [("x", "a"), ("prompt-2", "b")]
    jsonl.write_text('{"prompt": "a"}\n{"prompt": \n')
    with pytest.raises(MacspecError, match=r"p.jsonl:2: not valid JSON"):
        load_prompts(jsonl)
    with pytest.raises(MacspecError, match="no such file"):
        load_prompts(tmp_path / "missing.txt")
