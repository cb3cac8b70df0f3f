"""Prompt lookup and hybrid drafting: the n-gram index, the hybrid's choice, losslessness."""

from __future__ import annotations

import itertools
import json
import random
from collections import Counter
from pathlib import Path

import mlx.core as mx
import pytest
from mlx.utils import tree_map_with_path
from mlx_lm.generate import generate_step
from tiny import noisy_copy, random_model, save_model, tokenizer, write_tokenizer

from macspec.cli import main
from macspec.engine.core.sampling import SamplingParams
from macspec.engine.core.stats import Stats, sources_line, summary_line
from macspec.engine.drafters.lookup import HybridDrafter, LookupDrafter, NgramIndex
from macspec.engine.drafters.model import ModelDrafter
from macspec.engine.drafters.protocol import Draft, Drafter
from macspec.engine.generate.loop import Engine, GenerationConfig
from macspec.engine.policy.length import AutoPolicy, FixedPolicy
from macspec.errors import MacspecError
from macspec.models.build import build_engine, make_drafter
from macspec.models.catalog import ResolvedModels

GREEDY = SamplingParams()
EOS = 257


def propose(drafter, context, k=8) -> list[int]:
    return drafter.propose(context, k, GREEDY, None, None).tokens


def brute_force(context: list[int], sizes, limit: int, per_ngram: int = 2) -> list[int]:
    """The definition: longest n-gram first, its latest earlier occurrence, up to the end;
    a match shorter than the longest size proposes at most per_ngram ids per matched id."""
    end = len(context)
    for n in sorted(sizes, reverse=True):
        if n > end:
            continue
        gram = context[end - n :]
        for start in range(end - 1, n - 1, -1):  # latest first; start < end: no self-match
            if context[start - n : start] == gram:
                cap = limit if n == max(sizes) else min(limit, per_ngram * n)
                return context[start : min(start + cap, end)]
    return []


# -- the index ---------------------------------------------------------------------------------
def test_longest_ngram_first():
    context = [1, 2, 3, 4, 9, 2, 3, 5, 0, 3, 6, 1, 2, 3]
    assert propose(LookupDrafter(max_ngram=3), context, 2) == [4, 9]
    assert propose(LookupDrafter(max_ngram=2), context, 2) == [5, 0]
    assert propose(LookupDrafter(max_ngram=1), context, 2) == [6, 1]


def test_short_matches_propose_fewer_ids():
    context = [1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 2, 3]  # (2, 3) matches: a 2-gram, not a 3-gram
    assert propose(LookupDrafter(max_ngram=3), context, 8) == [4, 5, 6, 7]
    assert propose(LookupDrafter(max_ngram=3, guess_per_ngram=None), context, 8) == [
        4,
        5,
        6,
        7,
        8,
        9,
        0,
        2,
    ]
    assert propose(LookupDrafter(max_ngram=2), context, 8) == [4, 5, 6, 7, 8, 9, 0, 2]


def test_most_recent_match_never_past_the_end():
    context = [1, 2, 5, 8, 1, 2, 6, 1, 2]
    assert propose(LookupDrafter(), context, 8) == [6, 1, 2]  # not [5, 8, ...]: the latest
    assert propose(LookupDrafter(max_guess=2), context, 8) == [6, 1]
    assert propose(LookupDrafter(), context, 1) == [6]


def test_no_match_proposes_nothing():
    drafter = LookupDrafter(min_ngram=2)
    draft = drafter.propose([1, 2, 3, 4, 2], 4, GREEDY, None, None)
    assert draft == Draft(tokens=[], q=None, steps=0, fed=0, source="lookup")
    assert propose(LookupDrafter(), [7]) == []


def test_index_stays_exact_through_rollbacks_and_new_prompts():
    """Random engine-like use (grow, roll back, restart with a related prompt) vs the definition."""
    rng = random.Random(0)
    drafter = LookupDrafter(max_ngram=3, min_ngram=1, max_guess=6)
    context = [rng.randrange(4) for _ in range(10)]
    drafter.start(context)
    for step in range(600):
        action = rng.random()
        if action < 0.6:  # a cycle: n accepted + 1, then the engine's rollback(len - 1)
            context = context + [rng.randrange(4) for _ in range(rng.randint(1, 4))]
        elif action < 0.8:  # a deeper rollback, then the context grows differently
            keep = rng.randint(0, len(context))
            drafter.rollback(keep)
            context = context[:keep] + [rng.randrange(4) for _ in range(rng.randint(1, 3))]
        else:  # a new turn: a prompt sharing some prefix, via start()
            context = context[: rng.randint(0, len(context))] + [rng.randrange(4)]
            drafter.start(context)
        assert propose(drafter, context, 6) == brute_force(context, (1, 2, 3), 6), step
        drafter.rollback(len(context) - 1)
        assert drafter.index.latest == built_index(context).latest


def built_index(context: list[int]) -> NgramIndex:
    index = NgramIndex((1, 2, 3))
    for token in context:
        index.append(token)
    return index


def test_index_work_is_constant_per_token():
    """Counted work, not time: each id costs one registration per n-gram size, rollbacks of
    the id about to be fed back cost nothing, and a new turn costs only its changed suffix."""
    rng = random.Random(1)
    drafter = LookupDrafter(max_ngram=3, min_ngram=1)
    context = [rng.randrange(50) for _ in range(100)]
    drafter.start(context)
    for _ in range(1000):
        context += [rng.randrange(50) for _ in range(rng.randint(1, 5))]
        propose(drafter, context)
        drafter.rollback(len(context) - 1)
    assert drafter.index.updates <= 3 * len(context)
    before = drafter.index.updates
    turn = context[:-5] + [rng.randrange(50) for _ in range(10)]
    drafter.start(turn)  # the chat's next prompt: 5 ids undone, 10 indexed
    propose(drafter, turn)
    assert drafter.index.updates - before <= 3 * (5 + 10)


# -- the hybrid's choice -------------------------------------------------------------------------
class ScriptedModel(Drafter):
    """A stand-in draft model: proposes `guess`, records what the hybrid asks of it."""

    name = "model"

    def __init__(self, guess: list[int]):
        self.guess = guess
        self.calls: list[tuple[str, int]] = []

    def start(self, prompt):
        self.calls.append(("start", len(prompt)))

    def rollback(self, keep):
        self.calls.append(("rollback", keep))

    def propose(self, context, k, params, key, confidence_floor):
        self.calls.append(("propose", len(context)))
        return Draft(tokens=self.guess[:k], steps=k, fed=1, source="model")


def test_hybrid_takes_long_matches_and_asks_the_model_otherwise():
    model = ScriptedModel([9, 9])
    hybrid = HybridDrafter(model, min_ngram=2, min_guess=2)
    hybrid.start([1, 2, 3, 4, 5, 1, 2])
    assert hybrid.propose([1, 2, 3, 4, 5, 1, 2], 4, GREEDY, None, None).source == "lookup"
    hybrid.rollback(8)
    assert model.calls[-1] == ("rollback", 8)  # the model drafter is always rolled back
    # A 1-gram match, or a continuation of 1 id, is not long: the model is asked.
    assert hybrid.propose([1, 2, 3, 4, 5, 1, 2, 3, 6, 3], 4, GREEDY, None, None).source == "model"
    assert hybrid.propose([1, 2, 3, 4, 5, 6, 4, 5], 4, GREEDY, None, None).source == "model"


@pytest.mark.parametrize("lookup_right", [True, False])
def test_hybrid_learns_which_source_to_trust(lookup_right: bool):
    """Each cycle a fresh long match; the target commits what lookup or the model guessed."""
    fresh = itertools.count(1000)

    def ids(n: int) -> list[int]:
        return [next(fresh) for _ in range(n)]

    model = ScriptedModel([])
    hybrid = HybridDrafter(model, probe_every=8)
    context = ids(5)
    hybrid.start(context)
    sources = []
    for _ in range(40):
        gram, earlier = ids(3), ids(4)
        truth = earlier if lookup_right else ids(4)
        model.guess = ids(4) if lookup_right else truth
        context = context + gram + earlier + ids(2) + gram
        sources.append(hybrid.propose(context, 4, GREEDY, None, None).source)
        context = context + truth  # what the target committed
        hybrid.rollback(len(context) - 1)
    late = Counter(sources[-24:])
    assert late["lookup" if lookup_right else "model"] >= 20
    assert late["model"] >= 2  # the model is probed now and then even when lookup wins


# -- losslessness ------------------------------------------------------------------------------
def copying_model(seed: int):
    """A target that repeats: attention switched off makes the next id a function of the last,
    so a prompt that contains the target's own continuation is copied by lookup exactly."""
    model = random_model(seed, scale=3.0)
    model.update(tree_map_with_path(lambda p, w: w * 0 if "o_proj" in p else w, model.parameters()))
    mx.eval(model.parameters())
    return model


def reference(model, prompt: list[int], n: int) -> list[int]:
    steps = generate_step(mx.array(prompt), model, max_tokens=n)
    return [int(token) for token, _ in itertools.islice(steps, n)]


def repetitive_prompts(model, count: int, seed: int) -> list[list[int]]:
    """Noise, a passage holding the target's own continuation of a token, noise, that token."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(count):
        first = rng.randrange(256)
        passage = reference(model, [first], 24)
        noise = [[rng.randrange(256) for _ in range(rng.randint(2, 8))] for _ in range(2)]
        prompts.append(noise[0] + [first] + passage + noise[1] + [first])
    return prompts


def quoted_prompts(count: int, seed: int) -> list[list[int]]:
    """A random passage quoted twice and its start again: lookup fires, the target disagrees."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(count):
        passage = [rng.randrange(256) for _ in range(rng.randint(6, 16))]
        prompts.append(passage + [rng.randrange(256)] + passage + passage[: rng.randint(1, 4)])
    return prompts


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("tok")
    write_tokenizer(folder)
    return tokenizer(folder)


def assert_lossless(engine: Engine, model, prompts: list[list[int]], max_tokens: int) -> list:
    """One engine for all prompts, as a chat reuses it; each answer must be mlx-lm's."""
    results = []
    for prompt in prompts:
        done = list(engine.generate(prompt, GenerationConfig(max_tokens=max_tokens)))[-1]
        expected = reference(model, prompt, max_tokens)
        assert done.tokens == expected[: len(done.tokens)], prompt
        if done.finish_reason == "stop":
            assert expected[len(done.tokens)] == EOS
        else:
            assert len(done.tokens) == max_tokens
        committed = prompt + done.tokens
        assert engine.target.tokens == committed[: len(engine.target.tokens)]
        model_drafter = getattr(engine.drafter, "model", None)
        if model_drafter is not None:  # the hybrid's draft cache: committed ids only
            state = model_drafter.state.tokens
            assert state == committed[: len(state)]
        results.append(done.stats)
    return results


@pytest.mark.parametrize("kind", ["lookup", "hybrid"])
def test_greedy_is_the_targets_own_output(kind: str, tok):
    copier, plain = copying_model(3), random_model(4, scale=3.0)
    for target, prompts, copies in [
        (copier, repetitive_prompts(copier, 12, seed=0), True),
        (plain, quoted_prompts(10, seed=1), False),
    ]:
        if kind == "lookup":
            drafter = LookupDrafter()
        else:
            drafter = HybridDrafter(ModelDrafter(noisy_copy(target, 0.1, seed=5)))
        engine = Engine(target, tok, drafter, FixedPolicy(6))
        stats = assert_lossless(engine, target, prompts, max_tokens=40)
        proposed = sum(s.by_source.get("lookup", [0, 0])[0] for s in stats)
        assert proposed > 0  # lookup fired on every kind of prompt
        if copies:
            assert all(s.tokens_per_pass > 1.5 for s in stats)
            accepted = sum(s.by_source["lookup"][1] for s in stats)
            assert accepted / proposed > 0.7


# -- setup and the CLI ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model_folders(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("pair")
    target = copying_model(3)
    return save_model(target, root / "target"), save_model(
        noisy_copy(target, 0.1, 5), root / "draft"
    )


def resolved(target: Path, draft: Path | None) -> ResolvedModels:
    return ResolvedModels(target, draft, str(target), str(draft) if draft else None, None)


def test_build_engine_lookup_needs_no_draft_model(model_folders):
    target, draft = model_folders
    engine, loaded = build_engine(resolved(target, None), draft="lookup")
    assert isinstance(engine.drafter, LookupDrafter)
    assert isinstance(engine.policy, AutoPolicy)  # it prices guesses that cost no pass
    engine, loaded = build_engine(resolved(target, draft), draft="lookup")
    assert loaded.draft is None  # a pair's draft is not loaded for lookup
    engine, _ = build_engine(resolved(target, None), "5", draft="lookup")
    assert isinstance(engine.policy, FixedPolicy) and engine.policy.k == 5


def test_auto_policy_speculates_with_lookup_when_the_text_repeats(tok, monkeypatch):
    # A GPU-like cost curve (a pass over a few ids costs about one), pinned: what is tested is
    # the policy's choice, not how loaded this machine happens to be while the suite runs.
    monkeypatch.setattr(AutoPolicy, "pass_time", lambda self, m: 1e-3)
    model = copying_model(3)
    engine = Engine(model, tok, LookupDrafter(), AutoPolicy())
    stats = assert_lossless(engine, model, repetitive_prompts(model, 12, seed=1), 24)
    passes = sum(s.target_passes for s in stats)
    assert sum(s.generated_tokens for s in stats) / passes > 2.0


def test_build_engine_hybrid(model_folders):
    target, draft = model_folders
    engine, _ = build_engine(resolved(target, draft), draft="hybrid")
    assert isinstance(engine.drafter, HybridDrafter)
    assert isinstance(engine.drafter.model, ModelDrafter)
    with pytest.raises(MacspecError, match="needs a draft model"):
        build_engine(resolved(target, None), draft="hybrid")
    with pytest.raises(MacspecError, match="contradict"):
        build_engine(resolved(target, None), no_draft=True, draft="hybrid")
    engine, loaded = build_engine(resolved(target, None), no_draft=True)
    assert engine.drafter is None
    assert isinstance(make_drafter("lookup", loaded), LookupDrafter)  # what the bench builds
    with pytest.raises(MacspecError, match="needs a draft model"):
        make_drafter("hybrid", loaded)


def test_run_draft_lookup(model_folders, capsys):
    target, _ = model_folders
    prompt = "the cat sat on the mat. the cat sat on the mat. the cat"
    args = ["run", "--model", str(target), "--draft", "lookup", "--raw", "--json", prompt]
    rc = main([*args, "--max-tokens", "20"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    record = json.loads(out.out)
    assert record["draft_model"] is None
    assert record["stats"]["by_source"]["lookup"]["proposed"] > 0


def test_run_stats_line_gives_lookup_acceptance(model_folders, capsys):
    target, _ = model_folders
    prompt = "the cat sat on the mat. the cat sat on the mat. the cat"
    args = ["run", "--model", str(target), "--draft", "lookup", "--raw", "-k", "3", prompt]
    assert main([*args, "--json", "--max-tokens", "20"]) == 0
    lookup = json.loads(capsys.readouterr().out)["stats"]["by_source"]["lookup"]
    rate = lookup["accepted"] / lookup["proposed"]
    # fixed k and greedy: the same cycles again, now summarised on stderr
    assert main([*args, "--max-tokens", "20"]) == 0
    assert f"(lookup {rate:.0%} of {lookup['proposed']})" in capsys.readouterr().err


def test_sources_line_names_each_source_unless_a_model_drafted_alone():
    assert sources_line({}) is None and sources_line({"model": [10, 4]}) is None
    assert sources_line({"model": [10, 4], "lookup": [8, 6]}) == "lookup 75% of 8, model 40% of 10"
    stats = Stats(generated_tokens=12, target_passes=6, draft_proposed=8, draft_accepted=6)
    stats.by_source["lookup"] = [8, 6]
    line = summary_line(stats, "stop")
    assert "acceptance 75% of 8 guesses (lookup 75% of 8) · 2.00 tokens/pass" in line


def test_match_origin_script_splits_kept_guesses_by_where_they_were_found(capsys):
    """scripts/figures/lookup_match_origin.py on the demo pair: a row per grounded prompt, totals
    add up."""
    import importlib.util

    from macspec.bench.prompts import GROUNDED

    path = Path(__file__).parents[1] / "scripts" / "figures" / "lookup_match_origin.py"
    spec = importlib.util.spec_from_file_location("lookup_match_origin", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main(["--pair", "demo", "-k", "3", "--max-tokens", "40"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in lines[1:-1]]
    assert [r[0] for r in rows] == [p.name for p in GROUNDED]
    total = lines[-1].split()
    assert total[0] == "all"
    assert int(total[1]) == sum(int(r[1]) for r in rows)
    assert int(total[2]) == sum(int(r[2]) for r in rows)
    assert int(total[1]) + int(total[2]) > 0
