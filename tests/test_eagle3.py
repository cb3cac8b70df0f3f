"""EAGLE-3 heads: lossless at any temperature with a draft vocabulary smaller than the target's,
no extra target pass for the taps, both published formats, and bad heads refused in one line
before any weight is read. (Fidelity to mlx-vlm's drafter: tests/test_eagle3_fidelity.py.)

The heads here are made from the target (tests/eagle3kit.py), so guesses are kept and rejected.
"""

from __future__ import annotations

import json

import eagle3kit as kit
import mlx.core as mx
import pytest
import tiny
from losslesskit import PROMPTS, counted_run, done_of, reference
from mlx.utils import tree_flatten
from test_hidden_drafters import configs, run

from macspec.engine.core.events import Cycle
from macspec.engine.core.sampling import SamplingParams
from macspec.engine.drafters.eagle3 import Eagle3Config, Eagle3Drafter, Eagle3Head
from macspec.engine.generate.loop import Engine, GenerationConfig
from macspec.engine.policy.length import AutoPolicy, FixedPolicy
from macspec.models.eagle3 import load_eagle3

TAPS = (0, 1, 3)
"""0-based layers of the 4-layer targets: speculators ids [1, 2, 4], EAGLE ids [0, 1, 3]."""

# (target, 4-bit): each target at each precision. Both formats load into the same head
# (checked below), so each case runs the greedy check once, on the format it names.
CASES = [("llama", False, "speculators"), ("llama", True, "eagle"),
         ("qwen3", False, "eagle"), ("qwen3", True, "speculators")]  # fmt: skip
TARGETS = {"llama": kit.llama_target, "qwen3": kit.qwen3_target}
MAX_TOKENS = 12


def both_formats(target, root, bits=None, noise=0.3):
    """The same head written in both formats, loaded: (speculators head, EAGLE head)."""
    weights = kit.constructed(target, TAPS, noise=noise)
    config = kit.target_config(target)
    return [
        load_eagle3(kit.save_folder(target, root / form, weights, TAPS, form, bits=bits), config)
        for form in ("speculators", "eagle")
    ]


@pytest.fixture(scope="module", params=CASES, ids=lambda c: f"{c[0]}{' 4-bit' if c[1] else ''}")
def pair(request, tmp_path_factory):
    kind, four_bit, form = request.param
    target = TARGETS[kind]()
    heads = both_formats(target, tmp_path_factory.mktemp(kind), bits=4 if four_bit else None)
    if four_bit:
        target = kit.quantized(target)
    return target, heads, form


def test_both_formats_load_into_the_same_head(pair):
    _, (speculators, eagle), _ = pair
    assert speculators.config == eagle.config
    assert speculators.config.target_layers == TAPS and speculators.config.norm_before_residual
    mine, theirs = dict(tree_flatten(speculators.parameters())), tree_flatten(eagle.parameters())
    assert sorted(mine) == sorted(dict(theirs)) and "d2t" in mine
    assert all(mx.array_equal(mine[key], value).item() for key, value in theirs)


def test_greedy_is_the_target_alone(tok, pair):
    """k = 1, 2, 4 and auto over the 20 prompts (`--draft auto` with lookup: the pair test)."""
    target, heads, form = pair
    head = heads[form == "eagle"]
    prompts = [tok.encode(text) for text in PROMPTS]
    wants = [reference(target, p, MAX_TOKENS) for p in prompts]
    kept = {}
    for label, drafter, policy in configs(lambda: Eagle3Drafter(head, target)):
        if label == "--draft auto":
            continue
        engine = Engine(target, tok, drafter, policy)  # one engine: caches reused across prompts
        proposed = accepted = 0
        for prompt, want in zip(prompts, wants):
            done = done_of(engine.generate(prompt, GenerationConfig(max_tokens=MAX_TOKENS)))
            assert done.tokens == want, f"{label} {tok.decode(prompt)!r}"
            proposed, accepted = (
                proposed + done.stats.draft_proposed,
                accepted + done.stats.draft_accepted,
            )
        kept[label] = accepted / proposed
    assert 0.15 < kept["k=2"] < 0.95, kept  # guesses are kept and rejected: both paths run


def test_a_gpt_oss_target_with_sliding_windows_stays_exact(tok, tmp_path):
    """gpt-oss: MoE layers, 8-id sliding windows that wrap (prompts twice as long), rolled back
    by checkpoint; greedy output is the target alone's at k = 2 and auto."""
    target = tiny.near_bigram(tiny.arch_model("gpt_oss", 0, scale=3.0), mix=0.005)
    head = both_formats(target, tmp_path)[1]
    proposed = accepted = 0
    for policy in (FixedPolicy(2), AutoPolicy(confidence_floor=0.0)):
        engine = Engine(target, tok, Eagle3Drafter(head, target), policy)
        for text in PROMPTS[:5]:
            prompt = tok.encode(text) * 2
            done = done_of(engine.generate(prompt, GenerationConfig(max_tokens=MAX_TOKENS)))
            assert done.tokens == reference(target, prompt, MAX_TOKENS), text
            proposed += done.stats.draft_proposed
            accepted += done.stats.draft_accepted
    assert 0 < accepted < proposed  # guesses kept and rejected: rollbacks ran


def test_a_hybrid_qwen3_5_target_stays_exact(tok, tmp_path):
    """Qwen3.5: Gated DeltaNet layers between attention ones, rewound inside the recorded
    verify pass; the head reads the layers' outputs all the same."""
    target = tiny.near_bigram(tiny.arch_model("qwen3_5", 0, scale=3.0), mix=0.005)
    taps = (0, 1, 1)
    weights = kit.constructed(target, taps, noise=0.1)
    folder = kit.save_folder(target, tmp_path, weights, taps)
    head = load_eagle3(folder, kit.target_config(target))
    engine = Engine(target, tok, Eagle3Drafter(head, target), FixedPolicy(2))
    proposed = accepted = 0
    for text in PROMPTS[:3]:
        prompt = tok.encode(text)
        done = done_of(engine.generate(prompt, GenerationConfig(max_tokens=MAX_TOKENS)))
        assert done.tokens == reference(target, prompt, MAX_TOKENS), text
        proposed += done.stats.draft_proposed
        accepted += done.stats.draft_accepted
    assert 0 < accepted < proposed


def test_the_taps_cost_no_extra_target_pass(tok, tmp_path):
    target = kit.qwen3_target()
    head = both_formats(target, tmp_path)[0]
    engine = Engine(target, tok, Eagle3Drafter(head, target), FixedPolicy(3))
    prompt = tok.encode("The quick brown fox")
    calls, events = counted_run(target, engine, prompt, 24)
    cycles = [e for e in events if isinstance(e, Cycle)]
    done = done_of(events)
    assert done.tokens == reference(target, prompt, 24)
    # One prefill call, then exactly one target pass per cycle: none for the taps.
    assert len(calls) == 1 + len(cycles) == 1 + done.stats.target_passes
    assert any(c.accepted < c.proposed for c in cycles) and any(c.accepted for c in cycles)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_one_host_device_wait_per_cycle(tok, tmp_path, temperature):
    """The head drafts on the device: its guesses, q and the verdict are read in the cycle's one
    wait (tests/test_waits.py's count, with the head's passes counted as the target's)."""
    from test_waits import waits_per_cycle

    from macspec.bench.waits import WaitCounter

    target = kit.llama_target()
    head = both_formats(target, tmp_path, noise=0.1)[0]
    engine = Engine(target, tok, Eagle3Drafter(head, target), FixedPolicy(3))
    params = SamplingParams(temperature=temperature)
    config = GenerationConfig(max_tokens=24, sampling=params, seed=1)
    with WaitCounter([target, head]) as waits:
        cycles = waits_per_cycle(engine, tok.encode("the cat sat on the mat"), config, waits)
    assert sum(c.proposed for c, _ in cycles) >= 6
    assert all(w == 1 for c, w in cycles if c.requested), [(c.proposed, w) for c, w in cycles]


def test_seeded_sampling_is_plain_decodings_own_sample(tok, tmp_path):
    """The coupled sampler: a head's guesses, drawn over the target's ids with q = 0 outside the
    draft vocabulary, never change a seeded answer."""
    target = kit.llama_target()
    head = both_formats(target, tmp_path, noise=0.1)[0]
    plain, speculative = Engine(target, tok), Engine(target, tok, Eagle3Drafter(head, target))
    kept = 0
    for i, text in enumerate(PROMPTS[:6]):
        params = SamplingParams(temperature=0.7 + 0.3 * (i % 2), top_p=0.9 if i % 3 else 1.0)
        config = GenerationConfig(max_tokens=12, sampling=params, seed=i)
        want = done_of(plain.generate(tok.encode(text), config))
        done = done_of(speculative.generate(tok.encode(text), config))
        assert done.tokens == want.tokens, text
        kept += done.stats.draft_accepted
    assert kept > 0


def test_sampling_with_a_smaller_draft_vocabulary_has_the_targets_distribution(monkeypatch):
    """Three tokens at T = 1 with k = 2 over a 5-token vocabulary, exact joint by enumeration.
    The head scores 3 of the 5 ids (d2t maps them to 0, 2 and 4): q is 0 at ids 1 and 3, where
    the target still puts mass. The classic wrong rule fails the same bound."""
    from samplingkit import exact_joint, resample_from_p, sampled_joint
    from test_sampling import IdTokenizer, distribution_matches

    V = 5
    target, head = kit.three_of_five_pair(TAPS)

    def engine():
        return Engine(target, IdTokenizer(), Eagle3Drafter(head, target), FixedPolicy(2))

    params = SamplingParams(temperature=1.0)
    prompt = [1, 4, 2]
    exact = exact_joint(target, prompt, params, V)
    outcomes, rejected = sampled_joint(engine(), prompt, params, V, 400)
    assert rejected > 60
    assert {o // V**2 for o in outcomes} & {1, 3}  # ids the head cannot guess still come
    assert distribution_matches(outcomes, exact)
    monkeypatch.setattr("macspec.engine.generate.loop.sampled_verdict", resample_from_p)
    wrong, _ = sampled_joint(engine(), prompt, params, V, 400)
    assert not distribution_matches(wrong, exact)


def test_draft_ids_past_the_engines_width_are_never_guessed():
    """The engine may score fewer ids than the target has (a draft model's smaller table):
    draft ids that map past that width get q = 0 and are never guessed, greedy or sampled."""
    from test_sampling import IdTokenizer

    V = 5
    small = dict(hidden_size=32, num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    target = tiny.arch_model("qwen3", 11, scale=4.0, vocab=V, **small)
    layer = dict(small, intermediate_size=64, rms_norm_eps=1e-6, vocab_size=V, num_hidden_layers=1)
    head = Eagle3Head(Eagle3Config(layer, TAPS, target_hidden_size=32, draft_vocab_size=3))
    head.d2t = mx.array([0, 1, 2], mx.int32)  # target ids 0, 2, 4; the engine scores 0 .. 3
    head.lm_head.weight = mx.concatenate([mx.zeros((2, 32)), mx.full((1, 32), 9.0)])

    class Noting(Eagle3Drafter):  # id 4 would win every guess if it could be drafted
        drafts = []

        def propose(self, *args):
            draft = super().propose(*args)
            self.drafts.append(draft)
            return draft

    drafter = Noting(head, target, vocab_size=4)
    engine = Engine(target, IdTokenizer(), drafter, FixedPolicy(2), vocab_size=4)
    for params in (SamplingParams(), SamplingParams(temperature=1.0)):
        config = GenerationConfig(max_tokens=8, sampling=params, seed=0, sampler="rejection")
        assert max(done_of(engine.generate([1, 4, 2, 3], config)).tokens) < 4
    guessed = [t for d in drafter.drafts for t in d.tokens]
    assert guessed and max(guessed) < 4
    q = [d.q for d in drafter.drafts if d.q is not None]
    assert q and all(
        row.shape[-1] == 4 and mx.allclose(row.sum(-1), mx.array(1.0)).item() for row in q
    )


# -- the product: folders, flags, bad input ------------------------------------------------------
@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    target = kit.llama_target()
    weights = kit.constructed(target, TAPS, noise=0.1)
    good = {
        form: kit.save_folder(target, root / form, weights, TAPS, form, ship_embedding=True)
        for form in ("speculators", "eagle")
    }
    return {"target": tiny.save_model(target, root / "target"), **good}


def test_a_shipped_embedding_is_the_targets_unless_trained(folders, tmp_path):
    from macspec.models.drafters import read_config

    target = tiny.save_model(kit.llama_target(), tmp_path / "target")
    config = read_config(target)
    assert not load_eagle3(folders["speculators"], config).config.own_embedding
    trained = tmp_path / "trained"
    trained.mkdir()
    (trained / "config.json").write_text(
        json.dumps({**config_of(folders["speculators"]), "embed_requires_grad": True})
    )
    (trained / "model.safetensors").symlink_to(folders["speculators"] / "model.safetensors")
    head = load_eagle3(trained, config)
    shipped = mx.load(str(trained / "model.safetensors"))["embed_tokens.weight"]
    assert head.config.own_embedding and mx.array_equal(head.embed_tokens.weight, shipped)


def config_of(folder) -> dict:
    return json.loads((folder / "config.json").read_text())


def broken_head(root, config: dict, weights: bytes | dict = b"not safetensors"):
    """A head folder with this config and, by default, weights that cannot be read at all."""
    root.mkdir()
    (root / "config.json").write_text(json.dumps(config))
    if isinstance(weights, bytes):
        (root / "model.safetensors").write_bytes(weights)
    else:
        mx.save_safetensors(str(root / "model.safetensors"), weights)
    return root


def bad_heads(folders, root):
    speculators = config_of(folders["speculators"])
    layer = speculators["transformer_layer_config"]
    eagle = config_of(folders["eagle"])
    weights = dict(mx.load(str(folders["speculators"] / "model.safetensors")))
    wide = {**speculators, "transformer_layer_config": {**layer, "hidden_size": 32}}
    yield broken_head(root / "wide", wide), "an EAGLE-3 head for hidden size 32; the target's is 64"
    yield (
        broken_head(root / "deep", {**speculators, "eagle_aux_hidden_state_layer_ids": [1, 2, 5]}),
        "taps target hidden states [1, 2, 5] (speculators ids), but the target has 4 decoder "
        "layers",
    )
    deep = {**eagle, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 4]}}
    yield (
        broken_head(root / "deep-eagle", deep),
        "taps target layers [0, 1, 4] (EAGLE ids: 0-based layer outputs), but the target has 4",
    )
    yield (
        broken_head(root / "d2t", speculators, {**weights, "d2t": weights["d2t"][:150]}),
        "d2t has shape [150]; the draft vocabulary has 200 ids",
    )
    yield (
        broken_head(root / "both", {**speculators, "eagle_config": {}}),
        "both speculators fields and EAGLE ones",
    )


def test_bad_heads_are_one_line_before_any_weight_is_read(capsys, folders, tmp_path, monkeypatch):
    heads = list(bad_heads(folders, tmp_path))
    read = []
    monkeypatch.setattr(mx, "load", lambda *args, **kwargs: read.append(args) or 1 / 0)
    for head, needle in heads:
        code, out, err = run(
            capsys, "run", "hi", "--model", folders["target"], "--draft-model", head
        )
        assert code == 2 and out == "", err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("macspec: error:"), err
        assert needle in lines[0], err
    assert read == []  # neither the head's weights nor the target's


def test_a_head_folder_is_a_drafter_without_a_tokenizer(capsys, folders):
    assert not any(folders["speculators"].glob("tokenizer*"))
    base = ["run", "The quick brown fox", "--model", folders["target"], "--json"]
    base += ["--max-tokens", "12"]
    plain = json.loads(run(capsys, *base, "--no-draft")[1])
    for form in ("speculators", "eagle"):
        code, out, err = run(capsys, *base, "--draft-model", folders[form], "-k", "3")
        assert code == 0, err
        record = json.loads(out)
        assert record["drafter"] == "eagle3" and record["tokens"] == plain["tokens"]
        assert record["stats"]["draft_accepted"] > 0
    code, _, err = run(capsys, *base, "--draft-model", folders["eagle"], "--draft", "mtp")
    assert code == 2 and "--draft mtp needs an MTP head" in err and "an EAGLE-3 head" in err


def test_a_pairs_head_serves_draft_eagle3_and_auto(capsys, folders, tmp_path, monkeypatch):
    from macspec.models.build import build_engine
    from macspec.models.catalog import resolve_models

    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    (home / "models.toml").write_text(
        f'[[pair]]\nname = "mine"\ntarget = "{folders["target"]}"\n'
        f'eagle3 = "{folders["speculators"]}"\ndraft_policy = 2\ncontext_length = 512\n'
        'description = "a tiny target and its EAGLE-3 head"\nsize_gb = 0.01\n'
    )
    engine, _ = build_engine(resolve_models("mine", None, None), draft="auto")
    assert set(engine.drafter.drafters) == {"eagle3", "lookup", "suffix"}  # auto counts the head
    base = ["run", "The quick brown fox", "--pair", "mine", "--json", "--max-tokens", "12"]
    plain = json.loads(run(capsys, *base, "--no-draft")[1])
    code, out, err = run(capsys, *base, "--draft", "eagle3")
    assert code == 0, err
    record = json.loads(out)
    assert record["drafter"] == "eagle3" and record["tokens"] == plain["tokens"]
