"""Drafters that read the target: MTP heads (Qwen3.5/3.6) and DFlash block drafters.

Greedy output is mlx-lm's target-alone greedy token for token with each drafter, at fixed k,
`auto` and `--draft auto`; hidden states cost no extra target pass; the drafters' folders load
in their published formats, and bad ones are refused in one line before any weight is read.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import pytest
import tiny
from losslesskit import PROMPTS, counted_run, done_of, reference

from macspec.cli import main
from macspec.engine.core.events import Cycle
from macspec.engine.drafters.dflash import DFlashDrafter
from macspec.engine.drafters.lookup import LookupDrafter
from macspec.engine.drafters.mtp import MTPDrafter
from macspec.engine.generate.loop import Engine, GenerationConfig
from macspec.engine.policy.choice import DrafterChoice
from macspec.engine.policy.length import AutoPolicy, FixedPolicy
from macspec.errors import MacspecError
from macspec.models.drafters import NORM_SUFFIXES, load_dflash, load_mtp, read_config

MAX_TOKENS = 16


def quantized(model: nn.Module) -> nn.Module:
    nn.quantize(model, group_size=32, bits=4)
    mx.eval(model.parameters())
    return model


# (target kind, 4-bit) -> an MTP pair: a near-bigram target and a head that mostly agrees
MTP_CASES = [("qwen3_5", False), ("qwen3_5", True), ("qwen3_5_moe", False), ("qwen3_5_moe", True)]


@pytest.fixture(scope="module", params=MTP_CASES, ids=lambda c: f"{c[0]}{' 4-bit' if c[1] else ''}")
def mtp_pair(request, tmp_path_factory):
    kind, four_bit = request.param
    target = tiny.near_bigram(tiny.arch_model(kind, 0, scale=3.0), mix=0.02)
    folder = tiny.save_mtp_folder(
        target, tmp_path_factory.mktemp("mtp"), noise=0.005, bits=4 if four_bit else None
    )
    config = tiny.CONFIGS[id(target)]
    if four_bit:
        target = quantized(target)
    return target, load_mtp(folder, config)


DFLASH_KINDS = ["qwen3", "qwen3_5"]


@pytest.fixture(scope="module", params=DFLASH_KINDS)
def dflash_pair(request, tmp_path_factory):
    target = tiny.arch_model(request.param, 0, scale=3.0)
    folder = tiny.save_dflash_folder(tmp_path_factory.mktemp("dflash"), target_layer_ids=(0, 1))
    return target, load_dflash(folder, tiny.CONFIGS[id(target)])


def configs(make_drafter):
    """(label, drafter, policy) for k = 1, 2, 4, auto, and --draft auto (with lookup)."""
    for k in (1, 2, 4):
        yield f"k={k}", make_drafter(), FixedPolicy(k)
    yield "auto", make_drafter(), AutoPolicy(confidence_floor=0.0)
    choice = DrafterChoice([make_drafter(), LookupDrafter()])
    yield "--draft auto", choice, choice


def check_greedy(tok, target, make_drafter) -> dict[str, float]:
    """Every configuration over every prompt is the target alone; returns acceptance by label."""
    prompts = [tok.encode(text) for text in PROMPTS]
    wants = [reference(target, p, MAX_TOKENS) for p in prompts]
    acceptance = {}
    for label, drafter, policy in configs(make_drafter):
        engine = Engine(target, tok, drafter, policy)  # one engine: caches reused across prompts
        proposed = accepted = 0
        for prompt, want in zip(prompts, wants):
            done = done_of(engine.generate(prompt, GenerationConfig(max_tokens=MAX_TOKENS)))
            assert done.tokens == want, f"{label} {tok.decode(prompt)!r}"
            proposed += done.stats.draft_proposed
            accepted += done.stats.draft_accepted
        acceptance[label] = accepted / proposed if proposed else None
    return acceptance


def test_mtp_greedy_is_the_target_alone(tok, mtp_pair):
    target, head = mtp_pair
    acceptance = check_greedy(tok, target, lambda: MTPDrafter(head, target))
    assert 0.2 < acceptance["k=2"] < 0.95  # guesses are kept and rejected: both paths run


def test_dflash_greedy_is_the_target_alone(tok, dflash_pair):
    target, model = dflash_pair
    check_greedy(tok, target, lambda: DFlashDrafter(model, target))


# -- passes: hidden states and rejections cost no extra target pass ------------------------------
@pytest.mark.parametrize("drafter_kind", ["mtp", "dflash"])
def test_hidden_states_cost_no_extra_target_pass(tok, tmp_path, drafter_kind):
    target = tiny.near_bigram(tiny.arch_model("qwen3_5", 0, scale=3.0), mix=0.02)
    config = tiny.CONFIGS[id(target)]
    if drafter_kind == "mtp":
        drafter = MTPDrafter(
            load_mtp(tiny.save_mtp_folder(target, tmp_path, 0.005), config), target
        )
    else:
        drafter = DFlashDrafter(load_dflash(tiny.save_dflash_folder(tmp_path), config), target)
    engine = Engine(target, tok, drafter, FixedPolicy(3))
    prompt = tok.encode("The quick brown fox")
    calls, events = counted_run(target, engine, prompt, 24)
    cycles = [e for e in events if isinstance(e, Cycle)]
    done = done_of(events)
    assert done.tokens == reference(target, prompt, 24)
    # One prefill call, then exactly one target pass per cycle: no pass for hidden states,
    # none for a rejection (the Gated DeltaNet state is rewound inside the recorded pass).
    assert len(calls) == 1 + len(cycles) == 1 + done.stats.target_passes
    assert any(c.accepted < c.proposed for c in cycles)
    assert done.stats.refed_tokens == 0


# -- formats, the norm shift, and bad input -------------------------------------------------------
def raw_checkpoint(target, folder: Path) -> Path:
    """An original Hugging Face checkpoint: the trunk in one shard, mtp.* (norms centred on 0,
    as HF stores them) in another, and an index naming which holds what."""
    folder.mkdir(parents=True, exist_ok=True)
    weights = tiny.mtp_weights(target, 0.005)
    mtp = {
        f"mtp.{k}": (v - 1.0 if k.endswith(NORM_SUFFIXES) and v.ndim == 1 else v)
        for k, v in weights.items()
    }
    trunk = {"model.embed_tokens.weight": mx.zeros((4, 4))}
    mx.save_safetensors(str(folder / "model-00001-of-00002.safetensors"), trunk)
    mx.save_safetensors(str(folder / "model-00002-of-00002.safetensors"), mtp)
    weight_map = {k: "model-00001-of-00002.safetensors" for k in trunk}
    weight_map |= {k: "model-00002-of-00002.safetensors" for k in mtp}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (folder / "config.json").write_text(json.dumps(tiny.CONFIGS[id(target)]))
    return folder


def test_the_norm_shift_is_applied_exactly_once(tok, tmp_path, monkeypatch):
    from macspec.models import build
    from macspec.models.drafters import convert_mtp_checkpoint, mtp_norm_mean

    monkeypatch.setenv("MACSPEC_HOME", str(tmp_path / "home"))
    target = tiny.arch_model("qwen3_5", 0, scale=3.0)
    config = tiny.CONFIGS[id(target)]
    raw = raw_checkpoint(target, tmp_path / "raw")
    # A raw checkpoint converts: only the shard with mtp.* is read, norms + 1.
    read = []
    real_load = mx.load
    monkeypatch.setattr(
        mx, "load", lambda path, *a: read.append(Path(path).name) or real_load(path, *a)
    )
    out = convert_mtp_checkpoint(raw, tmp_path / "converted")
    monkeypatch.setattr(mx, "load", real_load)
    assert read == ["model-00002-of-00002.safetensors"]
    assert not (tmp_path / "converted.partial").exists()
    converted = mx.load(str(out / "model.safetensors"))
    assert abs(mtp_norm_mean(converted) - 1.0) < 0.2
    head = load_mtp(out, config)  # a shifted folder loads as it is
    want = tiny.mtp_weights(target, 0.005)["fc.weight"]
    assert mx.allclose(head.fc.weight, want).item()
    # The same raw folder given as --draft-model converts on the fly, once.
    assert build.converted_mtp_folder(raw).name == "raw-mtp"
    # Shifted twice: refused in one line, naming the problem.
    twice = tmp_path / "twice"
    twice.mkdir()
    (twice / "config.json").write_text((out / "config.json").read_text())
    doubled = {
        k: (v + 1.0 if k.endswith(NORM_SUFFIXES) and v.ndim == 1 else v)
        for k, v in converted.items()
    }
    mx.save_safetensors(str(twice / "model.safetensors"), doubled)
    with pytest.raises(MacspecError, match="shifted twice"):
        load_mtp(twice, config)
    # Not shifted at all (a raw tensor dump in the drafter format): refused too.
    unshifted = tmp_path / "unshifted"
    unshifted.mkdir()
    (unshifted / "config.json").write_text((out / "config.json").read_text())
    raw_tensors = {
        k: (v - 1.0 if k.endswith(NORM_SUFFIXES) and v.ndim == 1 else v)
        for k, v in converted.items()
    }
    mx.save_safetensors(str(unshifted / "model.safetensors"), raw_tensors)
    with pytest.raises(MacspecError, match="not shifted"):
        load_mtp(unshifted, config)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    hybrid = tiny.near_bigram(tiny.arch_model("qwen3_5", 0, scale=3.0), mix=0.02)
    other_size = tiny.arch_model("qwen3_5", 1, hidden_size=32, num_attention_heads=2, head_dim=16)
    llama = tiny.random_model(0, scale=3.0)
    return {
        "hybrid": tiny.save_arch_model(hybrid, root / "hybrid"),
        "mtp": tiny.save_mtp_folder(hybrid, root / "mtp", noise=0.005),
        "mtp32": tiny.save_mtp_folder(other_size, root / "mtp32"),
        "llama": tiny.save_model(llama, root / "llama"),
        "dflash": tiny.save_dflash_folder(root / "dflash", target_layer_ids=(0, 1)),
        "dflash_deep": tiny.save_dflash_folder(root / "dflash_deep", target_layer_ids=(1, 9)),
    }


def run(capsys, *args) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("target", "drafter", "needle"),
    [
        ("hybrid", "mtp32", "MTP head for hidden size 32; the target's is 64"),
        ("hybrid", "dflash_deep", "reads target layers [1, 9], but the target has 2"),
        ("llama", "mtp", "for Qwen3.5/3.6 (qwen3_5, qwen3_5_moe) targets; this target is llama"),
    ],
)
def test_bad_drafters_are_one_line_before_any_weight_is_read(
    capsys, folders, tmp_path, target, drafter, needle
):
    # Garbage weights: reading them would fail differently, so the config check came first.
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((folders[drafter] / "config.json").read_text())
    (broken / "model.safetensors").write_bytes(b"not safetensors")
    code, out, err = run(capsys, "run", "hi", "--model", folders[target], "--draft-model", broken)
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("macspec: error:") and needle in lines[0], err


def test_run_recognises_the_drafter_kind_from_its_folder(capsys, folders):
    base = [
        "run",
        "The quick brown fox",
        "--model",
        folders["hybrid"],
        "--json",
        "--max-tokens",
        "12",
    ]
    plain = json.loads(run(capsys, *base, "--no-draft")[1])
    for drafter, name in (("mtp", "mtp"), ("dflash", "dflash")):
        code, out, err = run(capsys, *base, "--draft-model", folders[drafter], "-k", "3")
        assert code == 0, err
        record = json.loads(out)
        assert record["drafter"] == name and record["tokens"] == plain["tokens"]
    code, out, err = run(capsys, *base, "--draft-model", folders["mtp"], "--draft", "auto")
    assert code == 0, err
    record = json.loads(out)
    assert record["drafter"] == "auto" and record["tokens"] == plain["tokens"]
    assert record["stats"]["drafter_choice"]
    code, _, err = run(capsys, *base, "--draft-model", folders["mtp"], "--draft", "dflash")
    assert code == 2 and "--draft dflash needs a DFlash drafter" in err


def test_drafter_configs_read_as_published(folders):
    assert read_config(folders["mtp"])["model_type"] == "qwen3_5_mtp"
    assert "dflash_config" in read_config(folders["dflash"])


# -- sampling: the target's distribution with each drafter -----------------------------------------
@pytest.mark.parametrize("drafter_kind", ["mtp", "dflash"])
def test_sampling_with_each_drafter_has_the_targets_distribution(drafter_kind, monkeypatch):
    """Three tokens at T = 1 with k = 2 over a 5-token vocabulary, exact joint by enumeration.
    The MTP run also shows the harness's power: the classic wrong rule fails the same bound."""
    from samplingkit import exact_joint, resample_from_p, sampled_joint
    from test_sampling import IdTokenizer, distribution_matches

    from macspec.engine.core.sampling import SamplingParams
    from macspec.engine.drafters.dflash import DFlashConfig, DFlashModel
    from macspec.engine.drafters.mtp import MTPHead

    V = 5
    small = dict(hidden_size=32, num_attention_heads=2, num_key_value_heads=1, head_dim=16)
    kind = "qwen3_5" if drafter_kind == "mtp" else "qwen3"
    target = tiny.arch_model(kind, 11, scale=4.0, vocab=V, **small)
    mx.random.seed(12)
    if drafter_kind == "mtp":
        head = MTPHead(tiny.CONFIGS[id(target)])
        head.update(tiny.tree_map(lambda w: w * 3.0 if w.ndim == 2 else w, head.parameters()))

        def drafter():
            return MTPDrafter(head, target)
    else:
        config = tiny.dflash_config(mask=V - 1)
        config.update(small, intermediate_size=64)
        model = DFlashModel(DFlashConfig.from_dict(config), 32)
        model.update(tiny.tree_map(lambda w: w * 3.0 if w.ndim == 2 else w, model.parameters()))

        def drafter():
            return DFlashDrafter(model, target)

    params = SamplingParams(temperature=1.0)
    prompt = [1, 4, 2]
    exact = exact_joint(target, prompt, params, V)
    outcomes, rejected = sampled_joint(
        Engine(target, IdTokenizer(), drafter(), FixedPolicy(2)), prompt, params, V, 1200
    )
    assert rejected > 200
    assert distribution_matches(outcomes, exact)
    if drafter_kind == "mtp":
        monkeypatch.setattr("macspec.engine.generate.loop.sampled_verdict", resample_from_p)
        wrong, _ = sampled_joint(
            Engine(target, IdTokenizer(), drafter(), FixedPolicy(2)), prompt, params, V, 1200
        )
        assert not distribution_matches(wrong, exact)


def test_an_mtp_head_drafts_after_the_target_reused_a_prefix_it_never_saw():
    """Unrelated prompts share their chat template's first ids: the target reuses them from
    its cache, so their hidden states never reach the head again. It drafts from where the
    target's hidden states start, rather than not at all (the demo pair's own MTP head)."""
    from macspec.models.catalog import resolve_models
    from macspec.models.pairs import open_pair
    from macspec.models.templates import encode_prompt

    opened = open_pair(resolve_models("demo", None, None), "2", draft="mtp")
    prompts = ["Add two numbers.", "Return the keys of a dict.", "Parse a date string."]
    for text in prompts:
        ids = encode_prompt(opened.tokenizer, text)
        done = done_of(opened.engine.generate(ids, GenerationConfig(max_tokens=24)))
        assert done.stats.draft_proposed > 0, text
    assert done.stats.prefilled_tokens < len(ids)  # the last one did reuse a prefix
