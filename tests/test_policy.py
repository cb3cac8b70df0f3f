"""The draft-length policy against simulated devices: it must find the best k and settle."""

from __future__ import annotations

import random

import pytest

from macspec.engine.core.events import Cycle
from macspec.engine.policy.length import AutoPolicy, FixedPolicy, make_policy
from macspec.errors import MacspecError


def simulate(policy, cycles, acceptance, pass_time, draft_step, seed=0):
    """Run the policy on a device with the given costs; return the chosen draft lengths.

    pass_time(cycle_index, m) is the target's pass over m tokens at that point of the run.
    """
    rng = random.Random(seed)
    choices, tokens, seconds = [], 0, 0.0
    for i in range(cycles):
        a = acceptance(i) if callable(acceptance) else acceptance
        k = policy.draft_length()
        accepted = 0
        while accepted < k and rng.random() < a:
            accepted += 1
        verify = pass_time(i, k + 1)
        cycle = Cycle(
            requested=k,
            proposed=k,
            accepted=accepted,
            draft_s=k * draft_step,
            verify_s=verify,
            overhead_s=0.0,
            draft_steps=k,
            draft_fed=k,
        )
        policy.observe(cycle)
        choices.append(k)
        tokens += accepted + 1
        seconds += cycle.draft_s + verify
    return choices, tokens / seconds


def cpu(m):  # a pass over m tokens costs about m passes over one
    return 0.010 * m


def gpu(m):  # flat up to 8 tokens, as on Apple GPUs
    return 0.010 * (1 + 0.02 * (m - 1)) if m <= 8 else 0.010 * m / 8


def best_fixed_rate(acceptance, pass_time, draft_step, max_k=8):
    expected = {}
    for k in range(max_k + 1):
        tokens = sum(acceptance**j for j in range(k + 1))
        expected[k] = tokens / (k * draft_step + pass_time(k + 1))
    return max(expected, key=expected.get), max(expected.values())


def test_on_a_cpu_it_settles_on_plain_decoding_and_probes_rarely():
    choices, rate = simulate(AutoPolicy(), 600, 0.7, lambda i, m: cpu(m), draft_step=0.001)
    late = choices[200:]
    assert late.count(0) / len(late) > 0.95
    plain_rate = 1 / cpu(1)
    assert rate > 0.95 * plain_rate  # within 5% of plain decoding, probes included


def test_on_a_gpu_it_speculates_near_the_best_fixed_k():
    choices, rate = simulate(AutoPolicy(), 600, 0.8, lambda i, m: gpu(m), draft_step=0.0008)
    best_k, best_rate = best_fixed_rate(0.8, gpu, 0.0008)
    assert best_k >= 4
    late = choices[100:]
    assert sum(late) / len(late) >= 3
    assert rate > 0.9 * best_rate


def test_it_switches_back_when_speculation_starts_to_pay():
    policy = AutoPolicy()

    def pass_time(i, m):  # the device changes after 300 cycles (say, the GPU frees up)
        return cpu(m) if i < 300 else gpu(m)

    choices, _ = simulate(policy, 900, 0.85, pass_time, draft_step=0.0008)
    assert choices[200:300].count(0) > 90
    assert sum(1 for k in choices[-200:] if k > 0) > 150


def test_low_acceptance_turns_speculation_off_even_on_a_gpu():
    choices, _ = simulate(AutoPolicy(), 400, 0.02, lambda i, m: gpu(m), draft_step=0.003)
    assert choices[100:].count(0) / 300 > 0.9


@pytest.mark.parametrize(
    "spec,expected",
    [("auto", AutoPolicy), ("AUTO", AutoPolicy), ("3", FixedPolicy), (5, FixedPolicy)],
)
def test_make_policy(spec, expected):
    assert isinstance(make_policy(spec), expected)


@pytest.mark.parametrize("spec", ["0", "-2", "many", "", None])
def test_bad_draft_lengths_are_user_errors(spec):
    with pytest.raises(MacspecError):
        make_policy(spec)


def test_the_price_says_a_big_draft_pays_where_its_guesses_are_kept_and_loses_where_not():
    """A draft at 0.44 of the target's cost per token (Qwen2.5-Coder 0.5B for 1.5B) on a GPU:
    its size alone decides nothing. Kept 90% of the time it pays (no note); kept 25%, or on a
    CPU where a pass over m ids costs m, the measured price says speculation loses."""
    paying = AutoPolicy()
    simulate(paying, 300, 0.9, lambda i, m: gpu(m), draft_step=0.0044)
    assert paying.price_note() is None
    for acceptance, device in ((0.25, gpu), (0.9, cpu)):
        losing = AutoPolicy()
        simulate(losing, 300, acceptance, lambda i, m, d=device: d(m), draft_step=0.0044)
        note = losing.price_note()
        assert note is not None and note.startswith("speculation loses here")
        assert "a guess costs 0.44 of a target pass" in note
    assert AutoPolicy().price_note() is None  # nothing measured: nothing said
    assert FixedPolicy(3).price_note() is None
