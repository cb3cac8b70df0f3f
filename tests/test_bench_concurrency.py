"""`macspec bench --concurrency`: macspec's batched speculation beside mlx-lm's batched
generation at each number of clients, with each row's output checked against mlx-lm's."""

from __future__ import annotations

import json

import pytest
from tiny import model_args, noisy_copy, random_model, save_model

from macspec.cli import main


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("benchconc")
    target = random_model(0, model_args(), scale=3.0)
    prompts = root / "prompts.txt"
    prompts.write_text("Hello there\nWrite a poem about snow\nList three colours\n")
    draft = save_model(noisy_copy(target, 0.02, 1), root / "draft")
    return save_model(target, root / "target"), draft, prompts


def test_each_level_runs_both_tools_and_the_rows_equal_mlx_lm(folders, capsys):
    target, draft, prompts = folders
    code = main(
        ["bench", "--model", str(target), "--draft-model", str(draft), "-k", "3"]
        + ["--prompts", str(prompts), "--concurrency", "1,3", "--max-tokens", "12", "--json"]
    )
    out = capsys.readouterr().out
    assert code == 0
    levels = json.loads(out)
    assert [level["clients"] for level in levels] == [1, 3]
    for level in levels:
        assert level["same_output"] is True
        assert level["macspec"]["tokens"] == level["mlx_lm"]["tokens"] > 0
        assert level["macspec"]["tokens_per_pass"] > 1  # a noisy copy: guesses are kept
    assert levels[1]["macspec"]["rows_per_pass"] > 1


@pytest.mark.parametrize("bad", ["0", "a,b", "1,200"])
def test_a_bad_list_is_one_line(folders, capsys, bad):
    target, _, _ = folders
    assert main(["bench", "--model", str(target), "--concurrency", bad]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--concurrency" in err
