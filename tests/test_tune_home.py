"""A macspec home that is a file stops `macspec tune` at once, in the home's one line (the
answers are kept there), before any model loads or any answer is generated."""

from __future__ import annotations

from tunekit import run_cli, tune_args, tune_models_fixture

from macspec.tune import run

models = tune_models_fixture()


def test_a_home_that_is_a_file_is_one_line_before_any_model_loads(models, tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.write_text("not a folder")
    monkeypatch.setenv("MACSPEC_HOME", str(home))

    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(run, "load_models", no_loading)
    code, stdout, stderr = run_cli(*tune_args(models, tmp_path / "draft", "weak", few=True))
    assert code == 2 and stdout == ""
    assert stderr == (
        f"macspec: error: {home}: the macspec home is a file, not a folder; move it aside, or "
        "set MACSPEC_HOME to another folder\n"
    )
    assert not (tmp_path / "draft").exists()
