"""Bad bytes, bad seeds, bad files and runaway runs at the command line: each is one line on
stderr and exit 2 (or, for Ctrl-C, a stats line and exit 130), never a traceback. And the
context window: a prompt that does not fit is refused, an answer stops at it ('context'), in
`run`, the chat and the bench."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tiny

from macspec.cli import main
from macspec.engine.generate import loop as loop_module

CONTEXT = 64


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """A tiny model; the same with a 64-token context; broken copies of it."""
    root = tmp_path_factory.mktemp("models")
    model = tiny.save_model(tiny.random_model(0), root / "model")
    short = tiny.save_model(tiny.random_model(0), root / "short")
    config = json.loads((short / "config.json").read_text())
    (short / "config.json").write_text(json.dumps({**config, "max_position_embeddings": CONTEXT}))
    broken = {}
    for name, damage in {
        "truncated": lambda data: data[: len(data) // 2],
        "bad-header": lambda data: b"\xff" * 8 + data[8:],
        "bad-json": lambda data: data[:10] + b"\0" * 20 + data[30:],
    }.items():
        folder = tiny.save_model(tiny.random_model(0), root / name)
        weights = folder / "model.safetensors"
        weights.write_bytes(damage(weights.read_bytes()))
        broken[name] = folder
    no_tokenizer = tiny.save_model(tiny.random_model(0), root / "no-tokenizer")
    (no_tokenizer / "tokenizer.json").unlink()
    return {"model": model, "short": short, "no-tokenizer": no_tokenizer, **broken}


def run_cli(capsys, monkeypatch, *args, stdin: bytes | None = None) -> tuple[int, str, str]:
    if stdin is not None:
        stream = io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8")
        monkeypatch.setattr("sys.stdin", stream)
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line(code: int, err: str, needle: str) -> None:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("macspec: error: "), err
    assert needle in lines[0], lines[0]
    assert "Traceback" not in err


ONE_LINE = {
    "invalid UTF-8 argument": (["run", "\udcff\udcfe", "--model", "{model}"], None, "UTF-8"),
    "binary stdin": (["run", "-", "--model", "{model}"], b"\xff\xfe\x00\x01", "stdin is not UTF-8"),
    "NUL bytes on stdin": (["run", "-", "--model", "{model}"], b"a\x00b", "binary data"),
    # Seeds: checked before anything loads (the model folder does not even exist).
    "seed -2": (["run", "hi", "--model", "/nowhere", "--seed", "-2"], None, "--seed"),
    "seed 2^64": (["run", "hi", "--model", "/nowhere", "--seed", str(2**64)], None, "--seed"),
    "chat seed -2": (["chat", "--model", "/nowhere", "--seed", "-2"], None, "--seed"),
    "bench seed 2^64": (["bench", "--model", "/x", "--seed", str(2**64)], None, "--seed"),
    "empty stop": (["run", "hi", "--model", "{model}", "--stop", ""], None, "--stop"),
    "chat empty stop": (["chat", "--model", "{model}", "--stop", ""], None, "--stop"),
    "65 draft tokens": (
        ["run", "hi", "--model", "{model}", "--draft-model", "{model}", "-k", "65"],
        None,
        "between 1 and 64",
    ),
    "nothing on stdin": (["run", "-", "--model", "{model}"], b"", "stdin gave no text"),
    # Checked before anything loads, greedy or not.
    "sampler typo, greedy": (["run", "hi", "--model", "/x", "--sampler", "bogus"], None, "bogus"),
    "temp inf": (["run", "hi", "--model", "/x", "--temp", "inf"], None, "a finite number"),
    "raw and system": (["run", "hi", "--model", "/x", "--raw", "--system", "s"], None, "--raw"),
    "raw and no-think": (["run", "hi", "--model", "/x", "--raw", "--no-think"], None, "--no-think"),
    "bench temp inf": (["bench", "--model", "{model}", "--temp", "inf"], None, "a finite number"),
    "bench draft typo": (["bench", "--model", "{model}", "--draft", "nope"], None, "'nope'"),
    "bench draft auto": (["bench", "--model", "{model}", "--draft", "auto"], None, "--draft all"),
    "bench plot folder": (
        ["bench", "--model", "{model}", "--plot", "/nowhere/at/all/x.png"],
        None,
        "no folder /nowhere/at/all",
    ),
    "truncated weights": (["run", "hi", "--model", "{truncated}"], None, "truncated"),
    "damaged weights header": (["run", "hi", "--model", "{bad-header}"], None, "damaged"),
    "damaged weights JSON": (["run", "hi", "--model", "{bad-json}"], None, "not valid JSON"),
    "no tokenizer.json": (["run", "hi", "--model", "{no-tokenizer}"], None, "no tokenizer"),
    "prompt longer than the context": (
        ["run", "x" * 200, "--model", "{short}"],
        None,
        f"context of {{short}} holds {CONTEXT}",
    ),
}


@pytest.mark.parametrize("case", list(ONE_LINE))
def test_bad_input_is_one_line_exit_2(capsys, monkeypatch, models, case):
    argv, stdin, needle = ONE_LINE[case]
    names = {k: str(v) for k, v in models.items()}
    argv = [a.format(**names) if "{" in a else a for a in argv]
    code, out, err = run_cli(capsys, monkeypatch, *argv, stdin=stdin)
    assert out == ""
    assert_one_line(code, err, needle.format(**names))


def test_the_largest_seed_works(capsys, monkeypatch, models):
    args = ["run", "hi", "--model", models["model"], "--temp", "1", "--max-tokens", "4"]
    code, _, err = run_cli(capsys, monkeypatch, *args, "--seed", str(2**64 - 1))
    assert code == 0, err


def test_the_whole_tokenizer_message_is_shown(capsys, monkeypatch, models, tmp_path):
    """A tokenizer mlx-lm cannot build: its whole message, on one line."""
    folder = tmp_path / "slow-tokenizer"
    folder.mkdir()
    for file in models["no-tokenizer"].iterdir():
        (folder / file.name).write_bytes(file.read_bytes())
    (folder / "tokenizer.model").write_bytes(b"not a sentencepiece model")
    code, _, err = run_cli(capsys, monkeypatch, "run", "hi", "--model", folder)
    assert_one_line(code, err, "cannot load")
    assert len(err) > 120  # not cut at its first line


# -- the context window -------------------------------------------------------------------


def test_a_prompt_past_the_context_is_refused_before_any_pass(capsys, monkeypatch, models):
    passes = []
    monkeypatch.setattr(
        loop_module.CachedModel, "prefill", lambda self, ids: passes.append(len(ids))
    )
    started = time.monotonic()
    code, _, err = run_cli(
        capsys, monkeypatch, "run", "-", "--model", models["short"], stdin=b"word " * 200_000
    )
    assert_one_line(code, err, "the prompt is")
    assert passes == [] and time.monotonic() - started < 60  # was 240 s of silence


def test_an_answer_stops_at_the_context_with_its_own_reason(capsys, monkeypatch, models):
    args = ["run", "hello", "--model", models["short"], "--max-tokens", "10000000"]
    code, out, err = run_cli(capsys, monkeypatch, *args, "--json")
    assert code == 0, err
    record = json.loads(out)
    assert record["finish_reason"] == "context"
    assert len(record["prompt_tokens"]) + len(record["tokens"]) == CONTEXT
    code, out, err = run_cli(capsys, monkeypatch, *args)
    assert code == 0 and err.strip().splitlines()[-1].endswith(" · context")
    # Within the context, max_tokens ends it as before.
    code, out, err = run_cli(capsys, monkeypatch, *args[:-1], "5")
    assert err.strip().endswith(" · length")


def test_the_bench_stops_every_tool_at_the_context(capsys, monkeypatch, models, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello there\n")
    short = str(models["short"])
    argv = ["bench", "--model", short, "--draft-model", short, "--quick", "--k", "2"]
    argv += ["--prompts", str(prompts), "--max-tokens", "200", "--json"]
    code, out, err = run_cli(capsys, monkeypatch, *argv)
    assert code == 0, err
    report = json.loads(out)
    assert report["settings"]["context_length"] == CONTEXT
    (prompt,) = report["prompts"]
    lengths = {r["generated_tokens"] for r in report["runs"]}
    assert lengths == {CONTEXT - prompt["prompt_tokens"]}  # every tool, not past the context
    assert {r["finish_reason"] for r in report["runs"] if r["config"].startswith("macspec")} == {
        "context"
    }
    assert all(group["lossless"] for group in report["lossless"])

    prompts.write_text("x" * 300 + "\n")
    code, _, err = run_cli(capsys, monkeypatch, *argv)
    last = err.strip().splitlines()[-1]  # after the warning about this draft's size
    assert code == 2 and last.startswith("macspec: error: prompt 'prompt-1' is 303 tokens")
    assert "Traceback" not in err


# -- Ctrl-C ------------------------------------------------------------------------------


def test_ctrl_c_during_run_ends_the_line_then_a_stats_line_exit_130(models):
    argv = [sys.executable, "-m", "macspec", "run", "hello", "--model", str(models["model"])]
    # Warm MLX's CPU kernel cache (in this test's TMPDIR) first: the CPU backend compiles a
    # kernel with system(), which ignores SIGINT while the compiler runs, so a Ctrl-C sent
    # then is lost by the OS, not mishandled (Linux CPU only; Metal compiles in-process).
    subprocess.run([*argv, "--max-tokens", "300"], capture_output=True, timeout=120, check=True)
    process = subprocess.Popen(
        [*argv, "--max-tokens", "100000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        # As a terminal's foreground job: a suite started in the background (`cmd &` in a
        # script) hands its children SIGINT ignored, and Python then keeps ignoring it.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        first = process.stdout.read(40)  # text is streaming
        assert first
        process.send_signal(signal.SIGINT)
        rest, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130
    assert (first + rest).endswith(b"\n")
    lines = err.decode().strip().splitlines()
    assert lines[-1].endswith(" · interrupted") and " tokens · " in lines[-1]
    assert " tok/s" in lines[-1]  # the rate so far
    assert "Traceback" not in err.decode()


def test_ctrl_c_while_the_program_starts_is_no_traceback(tmp_path):
    """A Ctrl-C during the imports: a fake `typer` that is interrupted while it loads."""
    fake = tmp_path / "fake" / "typer"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise KeyboardInterrupt\n")
    env = dict(os.environ, PYTHONPATH=str(fake.parent))
    entry = "import sys; from macspec.cli import main; sys.exit(main())"  # the console script
    for argv in ([sys.executable, "-m", "macspec", "--help"], [sys.executable, "-c", entry]):
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
        assert done.returncode == 130, done.stderr
        assert done.stderr.strip() == "macspec: interrupted" and "Traceback" not in done.stderr


def test_ctrl_c_inside_a_command_before_it_streams_is_one_line(capsys, monkeypatch, models):
    """typer turns a KeyboardInterrupt it catches into exit code 130 and says nothing."""

    def interrupted(*_args, **_kwargs):
        raise KeyboardInterrupt  # as Ctrl-C would, while the models load

    monkeypatch.setattr("macspec.models.build.build_engine", interrupted)
    code, out, err = run_cli(capsys, monkeypatch, "run", "hi", "--model", models["model"])
    assert (code, out) == (130, "")
    assert err.strip() == "macspec: interrupted"


class FailingStdout(io.StringIO):
    """A stdout whose writes fail once some text has gone through."""

    def __init__(self, error: OSError, after: int):
        super().__init__()
        self.error, self.after = error, after

    def write(self, text: str) -> int:
        if self.tell() + len(text) > self.after:
            raise self.error
        return super().write(text)


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_a_reader_that_goes_away_ends_the_run_quietly(capsys, monkeypatch, models, as_json):
    """`macspec run … | head -1`: the reader had what it wanted: exit 0, nothing said."""
    stdout = FailingStdout(BrokenPipeError(32, "Broken pipe"), after=0 if as_json else 3)
    argv = ["run", "hi", "--model", models["model"], "--max-tokens", "40"]
    monkeypatch.setattr("sys.stdout", stdout)
    code = main([*map(str, argv), *(["--json"] if as_json else [])])
    assert code == 0
    assert capsys.readouterr().err == ""


class StdoutOfAStoppedPipe(io.StringIO):
    """Ctrl-C in a terminal stops `macspec run … | head` both: the next write finds no reader."""

    def write(self, text: str) -> int:
        if self.tell():
            raise BrokenPipeError(32, "Broken pipe")
        super().write(text)
        raise KeyboardInterrupt


def test_ctrl_c_that_also_stops_the_reader_is_still_130_with_stats(capsys, monkeypatch, models):
    monkeypatch.setattr("sys.stdout", StdoutOfAStoppedPipe())
    code = main(["run", "hi", "--model", str(models["model"]), "--max-tokens", "40"])
    assert code == 130
    assert capsys.readouterr().err.strip().endswith(" · interrupted")


def test_a_full_disk_under_stdout_is_one_line(capsys, monkeypatch, models):
    monkeypatch.setattr("sys.stdout", FailingStdout(OSError(28, "No space left on device"), 3))
    code = main(["run", "hi", "--model", str(models["model"]), "--max-tokens", "40"])
    assert_one_line(code, capsys.readouterr().err, "cannot write the answer to stdout")


@pytest.mark.parametrize("closed", [0, 1], ids=["stdin", "stdout"])
def test_a_closed_stdin_or_stdout_is_not_a_failure(models, closed):
    """`<&-` or `>&-`: the model's weights must not be opened as fd 0 (MLX refuses that), and
    a closed stdout is /dev/null, not a traceback."""
    argv = [sys.executable, "-m", "macspec", "run", "hi", "--model", str(models["model"])]
    done = subprocess.run(
        [*argv, "--max-tokens", "4"],
        capture_output=closed != 1,
        stderr=subprocess.PIPE if closed == 1 else None,
        preexec_fn=lambda: os.close(closed),
        timeout=120,
    )
    err = done.stderr.decode()
    assert done.returncode == 0, err
    assert err.strip().splitlines()[-1].endswith(" · length"), err


def test_a_folder_where_models_toml_goes_is_one_line(capsys, monkeypatch):
    folder = Path(os.environ["MACSPEC_HOME"]) / "models.toml"
    folder.mkdir(parents=True)
    code, _, err = run_cli(capsys, monkeypatch, "models")
    assert_one_line(code, err, f"{folder}: a folder, not the TOML file")


# -- the user's TOML files ----------------------------------------------------------------

PAIR = (
    '[[pair]]\nname = "mine"\ntarget = "org/big"\ndraft_policy = "auto"\n'
    'context_length = 4096\ndescription = "d"\nsize_gb = {size}\n'
)


@pytest.mark.parametrize(
    "file, data, argv, needle",
    [
        ("models.toml", b'[[pair]]\nname = "\xff"\n', ["models"], "not UTF-8 text (byte 0xff"),
        ("config.toml", b'default_pair = "\xfe"\n', ["run", "hi"], "not UTF-8 text (byte 0xfe"),
        ("models.toml", PAIR.format(size="nan").encode(), ["models"], "size_gb must be finite"),
        ("models.toml", PAIR.format(size="inf").encode(), ["models"], "size_gb must be finite"),
        ("models.toml", PAIR.format(size="-inf").encode(), ["models"], "size_gb must be finite"),
    ],
    ids=["models.toml bytes", "config.toml bytes", "size nan", "size inf", "size -inf"],
)
def test_bad_toml_is_one_line_naming_the_file(capsys, monkeypatch, file, data, argv, needle):
    path = Path(os.environ["MACSPEC_HOME"]) / file
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    code, out, err = run_cli(capsys, monkeypatch, *argv)
    assert_one_line(code, err, needle)
    assert err.startswith(f"macspec: error: {path}: ")
