"""`macspec run` and `macspec chat` with --json-schema, --regex and --grammar: the answer fits
(the demo pair writes Python, so JSON is the mask's doing), it is what the engine alone gives
under the same grammar, and every bad flag is one line on stderr, exit 2, before any model
loads."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

import macspec
from macspec.cli import main
from macspec.cli.app import app
from macspec.engine.core.config import GenerationConfig
from macspec.engine.core.grammar import Grammar
from macspec.errors import EXIT_INCOMPLETE
from macspec.models.templates import encode_prompt

DEMO = Path(macspec.__file__).parent / "demo"
PAIR = ["--model", DEMO / "target", "--draft-model", DEMO / "draft"]
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("MACSPEC_HOME", str(tmp_path / "home"))


def invoke(capsys, *args):
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_schema_answer_fits_and_is_the_engines_own(capsys, tmp_path):
    schema = tmp_path / "person.json"
    schema.write_text(json.dumps(SCHEMA))
    code, out, err = invoke(
        capsys, "run", "a person", *PAIR, "--json-schema", schema, "--max-tokens", 64, "--json"
    )
    assert code == 0, err
    record = json.loads(out)
    assert record["finish_reason"] == "stop"
    person = json.loads(record["text"])
    assert set(person) == {"name", "age"} and 0 <= person["age"] <= 150
    assert len(person["name"]) <= 12
    # The target alone, greedy, under the same mask (no drafter).
    from mlx_lm import load

    from macspec.engine.generate.loop import Engine

    target, tokenizer = load(str(DEMO / "target"))
    prompt = encode_prompt(tokenizer, "a person")
    assert record["prompt_tokens"] == prompt
    config = GenerationConfig(64, grammar=Grammar.json_schema(SCHEMA))
    alone = list(Engine(target, tokenizer).generate(prompt, config))[-1]
    assert record["tokens"] == alone.tokens


def test_regex_and_lark_answers_match(capsys, tmp_path):
    pattern = r"def [a-z_]{1,8}\(x\): return x \+ [0-9]"
    code, out, err = invoke(capsys, "run", "add one", *PAIR, "--regex", pattern, "--max-tokens", 40)
    assert code == 0, err
    assert re.fullmatch(pattern, out.strip()), out
    lark = tmp_path / "answer.lark"
    lark.write_text('start: "yes" | "no" | "maybe"\n')
    code, out, err = invoke(capsys, "run", "well?", *PAIR, "--grammar", lark, "--max-tokens", 8)
    assert code == 0, err
    assert out.strip() in {"yes", "no", "maybe"}


def test_a_grammar_max_tokens_cuts_says_so_and_exits_3(capsys, tmp_path):
    schema = tmp_path / "person.json"
    schema.write_text(json.dumps(SCHEMA))
    code, out, err = invoke(
        capsys, "run", "a person", *PAIR, "--json-schema", schema, "--max-tokens", 3, "--json"
    )
    assert code == EXIT_INCOMPLETE == 3, err
    record = json.loads(out)
    assert record["finish_reason"] == "length" and len(record["tokens"]) == 3
    assert record["text"].startswith('{"')
    assert record["grammar_complete"] is False
    cut = "the answer was cut at --max-tokens (3) before the JSON schema was complete"
    assert f"macspec: {cut}: it is not valid JSON" in err and cut in record["incomplete"]
    code, out, err = invoke(capsys, "run", "a person", *PAIR, "--json-schema", schema,
                            "--max-tokens", 3)  # fmt: skip
    assert code == 3 and err.strip().splitlines()[-1] == f"macspec: {cut}: it is not valid JSON"
    # Room to finish: complete, exit 0, nothing said.
    code, out, err = invoke(capsys, "run", "a person", *PAIR, "--json-schema", schema,
                            "--max-tokens", 64, "--json")  # fmt: skip
    assert code == 0 and json.loads(out)["grammar_complete"] is True and "cut" not in err


def test_forced_ids_are_counted_apart_from_guesses(capsys):
    """--no-draft drafts nothing: a regex's forced ids are 'forced', never guesses."""
    pattern = "[0-9]{3}-[0-9]{4}"
    code, out, err = invoke(capsys, "run", "a number", *PAIR, "--no-draft", "--regex", pattern,
                            "--json")  # fmt: skip
    stats = json.loads(out)["stats"]
    assert code == 0 and re.fullmatch(pattern, json.loads(out)["text"])
    assert stats["draft_proposed"] == 0 and stats["acceptance_rate"] is None
    assert stats["forced_tokens"] > 0 and "grammar" not in stats["by_source"]
    code, out, err = invoke(capsys, "run", "a number", *PAIR, "--no-draft", "--regex", pattern)
    assert "acceptance" not in err and f"{stats['forced_tokens']} forced" in err


def bad_inputs(folder: Path) -> list[tuple[list, str]]:
    (folder / "notjson.json").write_text("{nope")
    (folder / "list.json").write_text("[1, 2]")
    (folder / "badtype.json").write_text('{"type": "nosuch"}')
    (folder / "bad.lark").write_text("start: foo(\n")
    (folder / "big.json").write_text(json.dumps({"x": "y" * 300_000}))
    return [
        (["--json-schema", folder / "missing.json"], "cannot read it"),
        (["--json-schema", folder], "cannot read it"),
        (["--json-schema", folder / "notjson.json"], "not JSON"),
        (["--json-schema", folder / "list.json"], "must be a JSON object"),
        (["--json-schema", folder / "badtype.json"], "cannot be used: Invalid type: nosuch"),
        (["--json-schema", folder / "big.json"], "bytes"),
        (["--regex", "a("], "unclosed group"),
        (["--grammar", folder / "bad.lark"], "cannot be used"),
        (["--regex", "a", "--grammar", folder / "bad.lark"], "--regex and --grammar both given"),
    ]


@pytest.mark.parametrize("command", ["run", "chat"])
def test_bad_grammar_flags_are_one_line_exit_2(capsys, tmp_path, command):
    for flags, says in bad_inputs(tmp_path):
        # No model named and none downloaded: the flag is refused before any is looked for.
        args = [command, "hi"] if command == "run" else [command]
        code, out, err = invoke(capsys, *args, *flags)
        assert code == 2, (flags, err)
        assert says in err, (flags, err)
        assert len(err.strip().splitlines()) == 1, err
        assert "Traceback" not in err and out == ""


@pytest.mark.parametrize("command", ["run", "chat"])
def test_help_names_the_structured_output_flags(command):
    result = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for flag in ("--json-schema", "--regex", "--grammar"):
        assert flag in result.output
    assert "one of --json-schema, --regex, --grammar" in " ".join(result.output.split())
