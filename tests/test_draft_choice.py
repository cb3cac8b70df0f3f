"""`--draft auto` between several draft models: a pair may list more than one, each is a
candidate under its own name, every candidate gets priced, and the pick is made per temperature
(a draft tuned on greedy answers may be the best guesser at T = 0 and the worst when sampling)."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest
import tiny

from macspec.cli import main
from macspec.engine.core.events import Cycle
from macspec.engine.core.sampling import SamplingParams
from macspec.engine.drafters.lookup import LookupDrafter
from macspec.engine.drafters.protocol import Drafter
from macspec.engine.policy.choice import DrafterChoice
from macspec.models.build import build_engine, model_labels
from macspec.models.catalog import resolve_models


class Named(Drafter):
    """A drafter as the choice sees it from its policy side: a name."""

    def __init__(self, name: str):
        self.name = name


def gpu(m: int) -> float:  # a pass over m ids, flat up to 8 as on Apple GPUs
    return 0.010 * (1 + 0.02 * (m - 1))


STEP = 0.001
"""Seconds of one draft model step."""


def run(choice: DrafterChoice, temperature: float, acceptance: dict, cycles: int, rng) -> Counter:
    """Cycles at `temperature` on a GPU-like device; which candidate drafted each one. A
    candidate that did not draft the cycle before catches up first (as a draft model does
    under --draft auto): its first step feeds the ids it missed."""
    choice.begin(SamplingParams(temperature=temperature))
    drafted, last = Counter(), None
    for _ in range(cycles):
        k, name = choice.draft_length(), choice.current
        if not k:
            choice.observe(Cycle(0, 0, 0, 0.0, gpu(1), 0.0, 0, 0, fed=1))
            last = None
            continue
        accepted = 0
        while accepted < k and rng.random() < acceptance[name]:
            accepted += 1
        missed = 0 if name == last else 6
        cycle = Cycle(
            requested=k,
            proposed=k,
            accepted=accepted,
            draft_s=STEP * (k - 1) + gpu(missed + 1) / gpu(1) * STEP,
            verify_s=gpu(k + 1),
            overhead_s=0.0,
            draft_steps=k,
            draft_fed=k + missed,
            draft_source=name,
            fed=k + 1,
        )
        choice.observe(cycle)
        drafted[name] += 1
        last = name
    return drafted


def test_the_pick_follows_the_temperature_and_each_keeps_its_figures():
    """'tuned' keeps most guesses greedily and few when sampling, 'stock' the reverse: the
    choice drafts mostly with tuned at T = 0 and with stock at T = 0.7, though stock drafts
    second and so always catches up (it was left unpriced, so never picked, before); back at
    T = 0 it picks tuned at once, from the figures it kept."""
    rng = random.Random(0)
    choice = DrafterChoice([Named("tuned"), Named("stock")])
    greedy = {"tuned": 0.85, "stock": 0.4}
    sampled = {"tuned": 0.3, "stock": 0.75}
    at_zero = run(choice, 0.0, greedy, 300, rng)
    assert at_zero["tuned"] > 4 * at_zero["stock"], at_zero
    assert set(choice.rates()) == {"tuned", "stock"}  # both priced
    # A new temperature starts its acceptance afresh, with the costs measured so far (the
    # device's at any temperature), so both are ranked from its first cycle.
    choice.begin(SamplingParams(temperature=0.7))
    assert choice.reason == "measuring" and set(choice.rates()) == {"tuned", "stock"}
    at_sampling = run(choice, 0.7, sampled, 300, rng)
    assert at_sampling["stock"] > 4 * at_sampling["tuned"], at_sampling
    assert choice.temperature == 0.7 and "stock:" in choice.reason
    choice.begin(SamplingParams(temperature=0.0))
    assert choice.current == "tuned" and choice.reason.startswith("tuned:")
    assert choice.draft_length() > 0 and choice.current == "tuned"  # no measuring again


def test_every_candidate_warms_up_before_any_is_compared():
    """Each candidate's warm-up (a guess cycle, then a plain step) follows the one before
    directly, so all of them fall among an engine's first timed cycles."""
    choice = DrafterChoice([Named("a"), Named("b"), LookupDrafter()])
    order = []
    for _ in range(6):
        k = choice.draft_length()
        order.append((choice.current, k > 0))
        choice.observe(
            Cycle(k, k, 0, STEP * k, gpu(k + 1), 0.0, k, k, choice.current if k else None)
        )
    assert order == [
        ("a", True), ("a", False), ("b", True), ("b", False), ("lookup", True), ("lookup", False)
    ]  # fmt: skip


def test_several_draft_models_are_named_apart():
    assert model_labels(["package:demo/draft-tuned", "package:demo/draft"]) == [
        "model (draft-tuned)",
        "model (draft)",
    ]
    assert model_labels(["org/a/draft", "/x/draft/"]) == ["model (draft #1)", "model (draft #2)"]
    with pytest.raises(ValueError, match="distinct names"):
        DrafterChoice([Named("model"), Named("model")])


@pytest.fixture(scope="module")
def two_drafts(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("two-drafts")
    target = tiny.random_model(0, scale=3.0)
    return {
        "target": tiny.save_model(target, root / "target"),
        "close": tiny.save_model(tiny.noisy_copy(target, 0.02, 1), root / "close"),
        "far": tiny.save_model(tiny.random_model(9), root / "far"),
    }


def test_a_pair_with_two_drafts_drafts_with_the_first_and_auto_measures_both(two_drafts, capsys):
    """`draft = [A, B]`: `run` drafts with A (the default); `--draft auto` loads B too and
    tries both under their own names; every answer is the target's alone."""
    from macspec.models.home import user_catalog_path

    path = user_catalog_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "[[pair]]\n"
        'name = "two"\n'
        f'target = "{two_drafts["target"]}"\n'
        f'draft = ["{two_drafts["close"]}", "{two_drafts["far"]}"]\n'
        'draft_policy = "auto"\ncontext_length = 4096\ndescription = "two drafts"\nsize_gb = 0.01\n'
    )
    args = ["run", "--pair", "two", "--json", "--max-tokens", "24", "hello there"]
    plain = json.loads(run_cli(capsys, *args, "--no-draft"))
    default = json.loads(run_cli(capsys, *args, "-k", "3"))
    assert default["draft_model"] == str(two_drafts["close"]) and default["drafter"] == "model"
    assert set(default["stats"]["by_source"]) == {"model"}
    auto = json.loads(run_cli(capsys, *args, "--draft", "auto"))
    assert auto["drafter"] == "auto" and auto["stats"]["drafter_choice"]
    assert default["tokens"] == auto["tokens"] == plain["tokens"]
    engine, _ = build_engine(resolve_models("two", None, None), draft="auto")
    assert list(engine.drafter.drafters) == ["model (close)", "model (far)", "lookup", "suffix"]
    engine, loaded = build_engine(resolve_models("two", None, None), draft="model")
    assert not loaded.more_drafts  # the second draft is loaded only for --draft auto


def run_cli(capsys, *args) -> str:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out
