"""The catalog: shipped models.toml, user merge, validation, resolve_models; home and memory."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from macspec.errors import MacspecError
from macspec.models import catalog, home, hub, memory
from macspec.models.catalog import load_catalog, resolve_models

PAIR = """
[[pair]]
name = "{name}"
target = "{target}"
draft = "{draft}"
draft_policy = "auto"
context_length = 4096
description = "a test pair"
size_gb = 0.01
"""


def user_catalog(text: str) -> Path:
    path = home.user_catalog_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def pair_toml(
    name: str = "tiny", target: str = "test/tiny-target", draft: str = "test/tiny-draft"
) -> str:
    return PAIR.format(name=name, target=target, draft=draft)


def test_shipped_catalog_has_the_required_pairs(hf_cache):
    pairs = load_catalog().pairs
    assert list(pairs)[0] == "demo" and pairs["demo"].is_packaged
    wanted = {
        "mlx-community/Llama-3.2-1B-Instruct-4bit": {
            "mlx-community/Meta-Llama-3.1-8B-Instruct-4bit",
            "mlx-community/Llama-3.3-70B-Instruct-4bit",
        },
        "mlx-community/Qwen2.5-0.5B-Instruct-4bit": {
            f"mlx-community/Qwen2.5-{b}-Instruct-4bit" for b in ("7B", "14B", "32B")
        },
        "mlx-community/Qwen2.5-Coder-0.5B-Instruct-4bit": {
            "mlx-community/Qwen2.5-Coder-32B-Instruct-4bit"
        },
        "mlx-community/Qwen3-0.6B-4bit": {
            *(f"mlx-community/Qwen3-{b}-4bit" for b in ("8B", "14B", "32B")),
            "mlx-community/Qwen3-30B-A3B-Instruct-2507-4bit",
        },
        # 2026: hybrid (Gated DeltaNet) and sliding-window targets, and lookup-only ones
        "mlx-community/Qwen3.5-0.8B-4bit": {
            f"mlx-community/Qwen{b}-4bit"
            for b in ("3.5-9B", "3.5-27B", "3.5-35B-A3B", "3.6-27B", "3.6-35B-A3B")
        },
        "mlx-community/gemma-3-1b-it-4bit": {
            "mlx-community/gemma-3-12b-it-4bit",
            "mlx-community/gemma-3-text-27b-it-4bit",
        },
        None: {f"mlx-community/gpt-oss-{b}-MXFP4-Q8" for b in ("20b", "120b")},
        "mlx-community/gemma-4-e2b-it-4bit": {
            f"mlx-community/gemma-4-{b}-it-4bit" for b in ("31b", "26b-a4b")
        },
    }
    for draft, targets in wanted.items():
        assert {p.target for p in pairs.values() if p.draft == draft} == targets
    for pair in pairs.values():
        assert pair.description and pair.size_gb > 0 and pair.context_length >= 512
        assert pair.draft_policy == "auto" or isinstance(pair.draft_policy, int)
    # EAGLE-3 heads: the 70B and the 120B among them, each pair's download counting its head
    heads = {p.name: p.eagle3 for p in pairs.values() if p.eagle3}
    assert heads["llama-3.3-70b"] == "RedHatAI/Llama-3.3-70B-Instruct-speculator.eagle3"
    assert heads["gpt-oss-120b"] == "lmsys/EAGLE3-gpt-oss-120b-bf16"
    assert all(pairs[name].heads["eagle3"] in pairs[name].members for name in heads)
    # Gemma 4's heads that macspec cannot serve are listed, by kind, and never downloaded
    notes = pairs["gemma4-31b"].unsupported
    assert [note.split()[0] for note in notes] == ["mtp", "dflash", "eagle3"]
    assert not {note.split()[1] for note in notes} & set(pairs["gemma4-31b"].members)


def test_packaged_catalog_file_is_the_repo_root_one():
    root = Path(__file__).resolve().parents[1] / "models.toml"
    assert catalog.SHIPPED_CATALOG.read_text() == root.read_text()


def test_user_catalog_adds_and_replaces_pairs(hf_cache):
    user_catalog(pair_toml() + pair_toml(name="qwen3-8b", target="me/other"))
    pairs = load_catalog().pairs
    assert pairs["tiny"].target == "test/tiny-target"
    assert pairs["qwen3-8b"].target == "me/other"
    assert list(pairs)[-1] == "tiny"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[pair]]\nname = \n", "invalid TOML: line 2, column 8: invalid value"),
        ("[pair\n", "invalid TOML: line 1, column 6: expected ']'"),
        ("[[pair]]\nname = 'x'\n[[pair]]\nname = 'x'\n", "pair 'x': missing field 'target'"),
        (pair_toml() + "colour = 'red'\n", "pair 'tiny': unknown key 'colour'"),
        (pair_toml() + pair_toml(), "duplicate pair name 'tiny'"),
        (pair_toml().replace("4096", '"long"'), "'context_length' must be an integer"),
        (pair_toml().replace("4096", "true"), "'context_length' must be an integer"),
        (pair_toml().replace('"auto"', '"greedy"'), 'draft_policy must be "auto" or an integer'),
        (pair_toml().replace('"auto"', "0"), "draft_policy must be between 1 and 64"),
        (pair_toml(name="Big/One"), "name must be lowercase"),
        (pair_toml() + "ranks = 0\n", "ranks (machines the target is sharded over) must be"),
        (pair_toml() + "ranks = 65\n", "must be between 1 and 64"),
        (pair_toml() + "ranks = 2.0\n", "'ranks' must be an integer"),
        (pair_toml() + "ranks = true\n", "'ranks' must be an integer"),
        (pair_toml() + "unsupported = 'x'\n", "'unsupported' must be a list of strings"),
        (pair_toml() + "unsupported = [1]\n", "'unsupported' must be a list of strings"),
        (pair_toml().replace('"test/tiny-draft"', "3"), "'draft' must be a string, or a list of"),
        (pair_toml().replace('"test/tiny-draft"', "[]"), "'draft' as a list must hold one string"),
        (pair_toml().replace('"test/tiny-draft"', '["a", 3]'), "must hold one string or more"),
        (pair_toml().replace('"test/tiny-draft"', '["a", "a"]'), "'draft' lists a model twice"),
        ("models = []\n", "unknown top-level key 'models'"),
        ("pair = 3\n", "'pair' must be an array of tables"),
    ],
)
def test_bad_user_catalog_is_one_line_naming_the_file(hf_cache, text, message):
    path = user_catalog(text)
    with pytest.raises(MacspecError) as info:
        load_catalog()
    assert str(info.value).startswith(f"{path}: ")
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_a_pair_may_ask_for_several_machines(hf_cache):
    user_catalog(pair_toml() + "ranks = 2\n" + pair_toml(name="one"))
    pairs = load_catalog().pairs
    assert (pairs["tiny"].ranks, pairs["one"].ranks) == (2, 1)


def test_memory_per_rank_splits_the_target_and_keeps_the_draft_whole(monkeypatch):
    monkeypatch.setattr(memory, "machine_memory_bytes", lambda: 4 * 10**9)
    cfg = {"num_hidden_layers": 1, "num_attention_heads": 1, "hidden_size": 1}
    kv = memory.kv_cache_bytes(cfg, 1000)  # 4000 bytes per model
    alone = memory.estimate(10**6, [cfg, cfg], 1000)
    assert alone.per_rank_bytes == alone.total_bytes == 10**6 + 2 * kv
    # 10**6 bytes of weights, 10**5 of them the draft's: the target's part and its KV over 4
    four = memory.estimate(10**6, [cfg, cfg], 1000, ranks=4, drafter_weights=10**5)
    assert four.total_bytes == alone.total_bytes
    assert four.per_rank_bytes == (9 * 10**5 + kv) // 4 + 10**5 + kv
    # a machine too small for the whole target fits its share
    big = memory.estimate(5 * 10**9, [cfg], 8)
    assert big.fits is False
    assert memory.estimate(5 * 10**9, [cfg], 8, ranks=2).fits is True


def test_fixed_draft_policy_is_an_int(hf_cache):
    user_catalog(pair_toml().replace('"auto"', "4"))
    assert load_catalog().get("tiny").draft_policy == 4


def test_unknown_pair_lists_the_known_ones(hf_cache):
    with pytest.raises(
        MacspecError, match=r"unknown pair 'nope' \(known: demo, demo-tuned, llama-3.1-8b,"
    ):
        load_catalog().get("nope")


def test_home_is_movable_and_platform_appropriate(monkeypatch, tmp_path):
    monkeypatch.setenv("MACSPEC_HOME", str(tmp_path / "h"))
    assert home.macspec_home() == tmp_path / "h"
    monkeypatch.delenv("MACSPEC_HOME")
    monkeypatch.setattr(home.sys, "platform", "darwin")
    assert home.macspec_home() == Path.home() / "Library" / "Application Support" / "macspec"
    monkeypatch.setattr(home.sys, "platform", "linux")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert home.macspec_home() == tmp_path / "xdg" / "macspec"
    monkeypatch.delenv("XDG_DATA_HOME")
    assert home.macspec_home() == Path.home() / ".local" / "share" / "macspec"


def test_default_pair_comes_from_user_config(hf_cache):
    assert catalog.default_pair_name() == "demo"
    home.config_path().parent.mkdir(parents=True)
    home.config_path().write_text('default_pair = "qwen3-8b"\n')
    assert catalog.default_pair_name() == "qwen3-8b"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("default_pair = 3\n", "'default_pair' must be a str"),
        ("colour = 'x'\n", "unknown key 'colour'"),
        ("default_pair = \n", "invalid TOML: line 1"),
    ],
)
def test_bad_user_config(hf_cache, text, message):
    home.config_path().parent.mkdir(parents=True)
    home.config_path().write_text(text)
    with pytest.raises(MacspecError, match=message):
        catalog.default_pair_name()


# ---- resolve_models -------------------------------------------------------------------------


def test_resolve_a_downloaded_pair(cached_model):
    target, draft = cached_model("test/tiny-target"), cached_model("test/tiny-draft")
    user_catalog(pair_toml())
    resolved = resolve_models("tiny", None, None)
    assert (resolved.target, resolved.draft) == (target, draft)
    assert (resolved.target_name, resolved.draft_name) == ("test/tiny-target", "test/tiny-draft")
    assert resolved.pair is not None and resolved.pair.name == "tiny"


def test_resolve_the_default_pair_from_config(cached_model):
    cached_model("test/tiny-target")
    cached_model("test/tiny-draft")
    user_catalog(pair_toml())
    home.config_path().write_text('default_pair = "tiny"\n')
    assert resolve_models(None, None, None).pair.name == "tiny"


def test_resolve_model_alone_is_target_only(cached_model, tiny_model_folder):
    snapshot = cached_model("test/tiny-target")
    resolved = resolve_models(None, "test/tiny-target", None)
    assert (resolved.target, resolved.draft, resolved.pair) == (snapshot, None, None)
    with_draft = resolve_models(None, "test/tiny-target", str(tiny_model_folder))
    assert with_draft.draft == tiny_model_folder and with_draft.draft_name == str(tiny_model_folder)


def test_draft_model_replaces_the_pairs_draft(cached_model, tiny_model_folder):
    cached_model("test/tiny-target")
    user_catalog(pair_toml())
    resolved = resolve_models("tiny", None, str(tiny_model_folder))
    assert resolved.draft == tiny_model_folder and resolved.pair.name == "tiny"


def test_a_pair_may_list_several_draft_models(cached_model, tiny_model_folder):
    """`draft = [A, B]`: A is the pair's draft (`--draft model`), B one more for --draft auto to
    measure; both are members to download; a --draft-model replaces them both."""
    for repo in ("test/tiny-target", "test/tiny-draft", "test/tiny-draft-2"):
        cached_model(repo)
    user_catalog(
        pair_toml().replace('"test/tiny-draft"', '["test/tiny-draft", "test/tiny-draft-2"]')
    )
    pair = load_catalog().get("tiny")
    assert (pair.draft, pair.more_drafts) == ("test/tiny-draft", ("test/tiny-draft-2",))
    assert pair.members == ("test/tiny-target", "test/tiny-draft", "test/tiny-draft-2")
    resolved = resolve_models("tiny", None, None)
    assert resolved.draft_name == "test/tiny-draft"
    assert [name for name, _ in resolved.more_drafts] == ["test/tiny-draft-2"]
    assert resolved.more_drafts[0][1] == hub.local_model_path("test/tiny-draft-2")
    assert resolve_models("tiny", None, str(tiny_model_folder)).more_drafts == ()


def test_the_demo_drafts_with_its_tuned_draft_first():
    """The default pair's first answer (greedy by default) drafts with the draft that keeps
    most guesses greedily; the stock draft, better when sampling, is there for --draft auto."""
    demo = load_catalog().get("demo")
    assert (demo.draft, demo.more_drafts) == ("package:demo/draft-tuned", ("package:demo/draft",))
    assert resolve_models(None, None, None).draft.name == "draft-tuned"


def test_plain_or_lookup_decoding_needs_no_draft_download(cached_model):
    target = cached_model("test/tiny-target")  # the pair's draft is not downloaded
    user_catalog(pair_toml())
    with pytest.raises(MacspecError, match="not downloaded"):
        resolve_models("tiny", None, None)
    resolved = resolve_models("tiny", None, None, need_draft=False)
    assert (resolved.target, resolved.draft, resolved.draft_name) == (target, None, None)


def test_resolve_works_offline_with_no_network(cached_model, monkeypatch, network_calls):
    cached_model("test/tiny-target")
    cached_model("test/tiny-draft")
    user_catalog(pair_toml())
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve_models("tiny", None, None).draft is not None
    assert network_calls == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("tiny", None, None),
            "pair 'tiny' is not downloaded (test/tiny-target missing); run: macspec pull tiny",
        ),
        (
            (None, "test/absent", None),
            "test/absent is not downloaded; run: macspec pull test/absent",
        ),
        (("tiny", "test/tiny-target", None), "--pair and --model both given"),
        (("nope", None, None), "unknown pair 'nope'"),
        ((None, "./no/such/folder", None), "no such model folder"),
    ],
)
def test_resolve_errors_are_one_line(hf_cache, args, message):
    user_catalog(pair_toml())
    with pytest.raises(MacspecError) as info:
        resolve_models(*args)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_incomplete_snapshot_counts_as_not_downloaded(cached_model):
    snapshot = cached_model("test/tiny-target")
    (snapshot / "model.safetensors").unlink()  # an interrupted pull
    assert hub.cached_model_path("test/tiny-target") is None
    with pytest.raises(MacspecError, match="run: macspec pull test/tiny-target"):
        resolve_models(None, "test/tiny-target", None)


def test_unknown_default_pair_names_the_config(hf_cache):
    home.config_path().parent.mkdir(parents=True)
    home.config_path().write_text('default_pair = "gone"\n')
    with pytest.raises(MacspecError, match=r"config.toml: default_pair 'gone' is not a known"):
        resolve_models(None, None, None)


# ---- memory ---------------------------------------------------------------------------------


def test_kv_cache_formula():
    config = {
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "hidden_size": 4096,
    }
    assert memory.kv_cache_bytes(config, 1000) == 2 * 32 * 8 * 128 * 1000 * 2
    assert memory.kv_cache_bytes({"text_config": {**config, "head_dim": 64}}, 10) == (
        2 * 32 * 8 * 64 * 10 * 2
    )
    assert memory.kv_cache_bytes({"hidden_size": 8}, 10) is None


def test_machine_memory_is_known_here():
    total = memory.machine_memory_bytes()
    assert total is not None and total > 2**28


def test_fits_is_unknown_until_the_kv_cache_is_known(monkeypatch):
    monkeypatch.setattr(memory, "machine_memory_bytes", lambda: 4 * 10**9)
    cfg = {"num_hidden_layers": 1, "num_attention_heads": 1, "hidden_size": 1}
    assert memory.estimate(10**9, [cfg], 8).fits is True
    assert memory.estimate(10**9, [None], 8).fits is None
    assert memory.estimate(5 * 10**9, [None], 8).fits is False


def test_pair_status_of_a_downloaded_pair(cached_model, tiny_model_folder):
    cached_model("test/tiny-target")
    cached_model("test/tiny-draft")
    user_catalog(pair_toml())
    status = catalog.pair_status(load_catalog().get("tiny"))
    config = json.loads((tiny_model_folder / "config.json").read_text())
    kv = memory.kv_cache_bytes(config, 4096)
    weights = (tiny_model_folder / "model.safetensors").stat().st_size
    assert status.downloaded
    assert status.memory.weights_bytes == 2 * weights
    assert status.memory.kv_cache_bytes == 2 * kv


def test_the_docs_example_pair_is_a_valid_user_pair(hf_cache):
    guide = (Path(__file__).resolve().parents[1] / "docs" / "models.md").read_text()
    blocks = re.findall(r"```toml\n(.*?)```", guide, re.S)
    (example,) = [block for block in blocks if "[[pair]]" in block]
    user_catalog(example)
    pair = load_catalog().get("my-qwen")
    assert (pair.target, pair.draft) == (
        "mlx-community/Qwen3-14B-4bit",
        "mlx-community/Qwen3-0.6B-4bit",
    )
    assert pair.draft_policy == "auto" and pair.ranks == 1
