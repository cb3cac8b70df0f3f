"""`macspec run` end to end on tiny saved models: streaming, --json, and every bad input."""

from __future__ import annotations

import io
import json

import mlx.core as mx
import pytest
import tiny
from mlx.utils import tree_flatten
from mlx_lm.generate import generate_step
from mlx_lm.models import mamba
from mlx_lm.utils import load

from macspec.cli import main
from macspec.engine.policy.length import AutoPolicy

STATS_KEYS = {
    "prompt_tokens",
    "generated_tokens",
    "target_passes",
    "draft_proposed",
    "draft_accepted",
    "acceptance_rate",
    "tokens_per_pass",
    "accepted_histogram",
    "ttft_s",
    "decode_tokens_per_s",
    "elapsed_s",
    "draft_s",
    "verify_s",
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    target = tiny.random_model(0, scale=3.0)
    paths = {
        "target": tiny.save_model(target, root / "target"),
        "draft": tiny.save_model(tiny.noisy_copy(target, 0.01, seed=1), root / "draft"),
        "shifted": tiny.save_model(tiny.random_model(3), root / "shifted", tokenizer_shift=7),
    }
    # A state-space model: its cache rolls back by checkpoints, not by trimming.
    args = mamba.ModelArgs(
        model_type="mamba",
        vocab_size=tiny.VOCAB,
        hidden_size=32,
        intermediate_size=64,
        state_size=8,
        num_hidden_layers=1,
        conv_kernel=4,
        use_bias=False,
        use_conv_bias=True,
        time_step_rank=4,
    )
    model = mamba.Model(args)
    folder = root / "mamba"
    folder.mkdir()
    config = {k: v for k, v in vars(args).items()}
    config.update(eos_token_id=257, bos_token_id=256)
    (folder / "config.json").write_text(json.dumps(config))
    mx.save_safetensors(str(folder / "model.safetensors"), dict(tree_flatten(model.parameters())))
    tiny.write_tokenizer(folder)
    paths["mamba"] = folder
    return paths


def invoke(capsys, monkeypatch, *args, stdin: str | None = None):
    if stdin is not None:
        monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_output_is_complete_and_lossless(capsys, monkeypatch, folders):
    code, out, err = invoke(
        capsys,
        monkeypatch,
        "run",
        "hello there",
        "--model",
        folders["target"],
        "--draft-model",
        folders["draft"],
        "--num-draft-tokens",
        "3",
        "--max-tokens",
        "20",
        "--json",
    )
    assert code == 0, err
    record = json.loads(out)
    assert {
        "prompt_tokens",
        "tokens",
        "sources",
        "text",
        "finish_reason",
        "stats",
        "model",
        "draft_model",
    } <= set(record)
    assert STATS_KEYS <= set(record["stats"])
    assert len(record["sources"]) == len(record["tokens"])
    assert set(record["sources"]) <= {"draft", "target"}
    model, _ = load(str(folders["target"]))
    expected = [
        t for t, _ in generate_step(mx.array(record["prompt_tokens"]), model, max_tokens=20)
    ]
    cut = expected.index(257) if 257 in expected else len(expected)
    assert record["tokens"] == expected[:cut]
    assert record["stats"]["generated_tokens"] == len(record["tokens"])
    assert record["stats"]["draft_proposed"] > 0
    # The chat template was applied: the prompt ends with the assistant marker.
    assert record["prompt_tokens"][-1] == 259


def test_streams_text_and_prints_stats_on_stderr(capsys, monkeypatch, folders):
    code, out, err = invoke(
        capsys,
        monkeypatch,
        "run",
        "hello there",
        "--model",
        folders["target"],
        "--draft-model",
        folders["draft"],
        "--max-tokens",
        "12",
    )
    assert code == 0
    _, json_out, _ = invoke(
        capsys,
        monkeypatch,
        "run",
        "hello there",
        "--model",
        folders["target"],
        "--draft-model",
        folders["draft"],
        "--max-tokens",
        "12",
        "--json",
    )
    text = json.loads(json_out)["text"]
    assert out.rstrip("\n") == text.rstrip("\n")
    stats_line = err.strip().splitlines()[-1]
    assert "12 tokens" in stats_line and "tokens/pass" in stats_line and "ttft" in stats_line
    # A draft's size is no price: as big as its target, it is judged by what it measures.
    assert "target's size" not in err


PRICE = "speculation loses here at the measured prices: (as measured)"


@pytest.mark.parametrize("chosen", ["named", "catalog pair"])
def test_a_draft_that_measures_a_loss_is_said_only_when_the_user_named_it(
    capsys, monkeypatch, folders, chosen
):
    """The cost model of `-k auto` measured a loss over the answer (its figures are
    test_policy's): a warning before the stats line for a draft the user named, none for a
    pair macspec chose itself (the catalog's, `--draft-model auto`'s)."""
    monkeypatch.setattr(AutoPolicy, "price_note", lambda self: PRICE)
    models = ["--model", folders["target"], "--draft-model", folders["draft"]]
    args = ["run", "hi", *(models if chosen == "named" else []), "--max-tokens", "4", "-k", "auto"]
    code, out, err = invoke(capsys, monkeypatch, *args)
    assert code == 0, err
    warned = f"macspec: warning: {PRICE} (a smaller draft, or --no-draft)"
    assert (warned in err.splitlines()) == (chosen == "named")
    assert "tokens/pass" in err.strip().splitlines()[-1]
    code, out, err = invoke(capsys, monkeypatch, *args, "--json")
    assert json.loads(out)["stats"]["price_note"] == PRICE


def test_stdin_prompt_raw_and_no_draft(capsys, monkeypatch, folders):
    code, out, err = invoke(
        capsys,
        monkeypatch,
        "run",
        "-",
        "--model",
        folders["target"],
        "--draft-model",
        folders["draft"],
        "--raw",
        "--no-draft",
        "--json",
        "--max-tokens",
        "8",
        stdin="abc",
    )
    assert code == 0, err
    record = json.loads(out)
    # The raw text's ids, no chat template around them.
    assert record["prompt_tokens"] == tiny.tokenizer(folders["target"]).encode("abc")
    assert len(record["prompt_tokens"]) == 3
    # `echo abc | macspec run -` is the prompt "abc": echo's newline is not the user's.
    for piped in ("abc\n", "abc\r\n\n"):
        args = ["run", "-", "--model", folders["target"], "--raw", "--json", "--max-tokens", "1"]
        code, out, err = invoke(capsys, monkeypatch, *args, stdin=piped)
        assert code == 0, err
        assert json.loads(out)["prompt_tokens"] == record["prompt_tokens"]
    assert record["draft_model"] is None
    assert record["stats"]["acceptance_rate"] is None
    assert set(record["sources"]) <= {"target"}


@pytest.mark.parametrize("prompt", [" ", "\n\n\n", "   \t"])
@pytest.mark.parametrize("raw", [True, False], ids=["raw", "chat"])
def test_a_prompt_of_whitespace_is_content(capsys, monkeypatch, folders, prompt, raw):
    """Whitespace is a prompt (a raw continuation of code, a document of blank lines): it is
    answered, with the target alone's ids, from the argument and from stdin alike."""
    args = ["--model", folders["target"], "--json", "--max-tokens", "4", *(["--raw"] * raw)]
    code, out, err = invoke(capsys, monkeypatch, "run", prompt, *args, "--no-draft")
    assert code == 0, err
    alone = json.loads(out)
    if raw:
        assert alone["prompt_tokens"] == tiny.tokenizer(folders["target"]).encode(prompt)
    code, out, err = invoke(capsys, monkeypatch, "run", prompt, *args, "-k", "2")
    assert code == 0, err
    assert json.loads(out)["tokens"] == alone["tokens"]
    # Piped, its last line ends are dropped (echo's newline); what is left is the prompt.
    code, out, err = invoke(capsys, monkeypatch, "run", "-", *args, stdin=f" {prompt}\n")
    assert code == 0, err
    if raw:
        piped = tiny.tokenizer(folders["target"]).encode(f" {prompt}".rstrip("\r\n"))
        assert json.loads(out)["prompt_tokens"] == piped


@pytest.mark.parametrize("stdin", ["", "\n", "\r\n\n"])
def test_stdin_of_nothing_but_line_ends_is_empty(capsys, monkeypatch, folders, stdin):
    args = ["run", "-", "--model", folders["target"], "--raw"]
    code, out, err = invoke(capsys, monkeypatch, *args, stdin=stdin)
    assert code == 2 and out == ""
    why = "stdin gave no text" if not stdin else "stdin gave only line ends"
    assert err.strip() == f"macspec: error: the prompt is empty ({why})"


def test_sampled_runs_repeat_with_a_seed(capsys, monkeypatch, folders):
    args = [
        "run",
        "hi",
        "--model",
        folders["target"],
        "--draft-model",
        folders["draft"],
        "--temp",
        "0.8",
        "--seed",
        "5",
        "--max-tokens",
        "16",
        "--json",
    ]
    first = json.loads(invoke(capsys, monkeypatch, *args)[1])
    second = json.loads(invoke(capsys, monkeypatch, *args)[1])
    assert first["tokens"] == second["tokens"]
    # --seed -1, as the APIs take it: a fresh seed each time, as with no --seed.
    unseeded = args[:-4] + ["-1", "--max-tokens", "16", "--json"]
    runs = [json.loads(invoke(capsys, monkeypatch, *unseeded)[1])["tokens"] for _ in range(3)]
    assert len({tuple(r) for r in runs}) > 1


BAD_INPUTS = {
    "missing model folder": (["run", "hi", "--model", "{tmp}/nowhere"], "nowhere"),
    "vocabulary differs": (
        ["run", "hi", "--model", "{target}", "--draft-model", "{shifted}"],
        "tokenizers differ",
    ),
    "draft model asked for, none given": (
        ["run", "hi", "--model", "{target}", "--draft", "model"],
        "needs a draft model",
    ),
    "a DFlash drafter asked for, a draft model given": (
        ["run", "hi", "--model", "{target}", "--draft-model", "{draft}", "--draft", "dflash"],
        "but the drafter at hand is a draft model: pass --draft model to draft with it (or "
        "hybrid, auto, lookup), or --draft-model with a DFlash drafter (a z-lab folder",
    ),
    "no draft and a draft source": (
        ["run", "hi", "--model", "{target}", "--no-draft", "--draft", "lookup"],
        "contradict",
    ),
    "empty prompt": (["run", "", "--model", "{target}"], "the prompt is empty"),
    "max tokens 0": (["run", "hi", "--model", "{target}", "--max-tokens", "0"], "--max-tokens"),
    "max tokens negative": (
        ["run", "hi", "--model", "{target}", "--max-tokens", "-3"],
        "--max-tokens",
    ),
    "negative temperature": (["run", "hi", "--model", "{target}", "--temp", "-1"], "--temp"),
    "zero draft tokens": (
        ["run", "hi", "--model", "{target}", "--draft-model", "{draft}", "--num-draft-tokens", "0"],
        "--num-draft-tokens",
    ),
    "junk draft tokens": (
        [
            "run",
            "hi",
            "--model",
            "{target}",
            "--draft-model",
            "{draft}",
            "--num-draft-tokens",
            "lots",
        ],
        "--num-draft-tokens",
    ),
    "not a number": (["run", "hi", "--model", "{target}", "--temp", "warm"], "--temp"),
    "unknown flag": (["run", "hi", "--model", "{target}", "--colour"], "--colour"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_one_line_and_exit_2(capsys, monkeypatch, folders, tmp_path, case):
    args, needle = BAD_INPUTS[case]
    names = {k: str(v) for k, v in folders.items()} | {"tmp": str(tmp_path)}
    code, out, err = invoke(capsys, monkeypatch, *[a.format(**names) for a in args])
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("macspec: error:"), err
    assert needle in lines[0]
    assert "Traceback" not in err


def test_plain_decoding_works_with_a_cache_that_cannot_roll_back(capsys, monkeypatch, folders):
    code, out, err = invoke(
        capsys, monkeypatch, "run", "hi", "--model", folders["mamba"], "--max-tokens", "5", "--json"
    )
    assert code == 0, err
    assert json.loads(out)["stats"]["generated_tokens"] <= 5


def test_a_recurrent_model_speculates_losslessly(capsys, monkeypatch, folders):
    """Mamba's cache cannot be trimmed; checkpoints roll it back, so it drafts for itself."""
    args = ["run", "hi", "--model", folders["mamba"], "--max-tokens", "12", "--json", "-k", "3"]
    plain = json.loads(invoke(capsys, monkeypatch, *args, "--no-draft")[1])
    code, out, err = invoke(capsys, monkeypatch, *args, "--draft-model", folders["mamba"])
    assert code == 0, err
    spec = json.loads(out)
    assert spec["tokens"] == plain["tokens"]
    assert spec["stats"]["draft_proposed"] > 0


def test_a_model_alone_drafts_by_lookup_by_default(capsys, monkeypatch, folders):
    args = ["run", "ab ab ab ab ab ab", "--model", folders["target"], "--max-tokens", "12"]
    code, out, err = invoke(capsys, monkeypatch, *args, "--json", "-k", "2")
    assert code == 0, err
    record = json.loads(out)
    assert record["drafter"] == "lookup" and record["draft_model"] is None
    plain = json.loads(invoke(capsys, monkeypatch, *args, "--json", "--no-draft")[1])
    assert plain["drafter"] is None and plain["tokens"] == record["tokens"]
