"""How a model's tokenizer is loaded beside its weights: the end-of-sequence ids mlx_lm.load
would give it (a generation_config.json's too), and no Python copy of its vocabulary kept."""

from __future__ import annotations

import json

import tiny

from macspec.models.loader import draft_tokenizer, load_model


def test_a_generation_config_adds_end_of_sequence_ids_as_mlx_lm_load_does(tmp_path):
    model = tiny.random_model(seed=3)
    folder = tiny.save_model(model, tmp_path / "m")
    assert draft_tokenizer(folder).eos_token_ids == {257}
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [257, 258]}))
    _, tokenizer = load_model(folder, "model")
    assert tokenizer.eos_token_ids == {257, 258}
    assert draft_tokenizer(folder).eos_token_ids == {257, 258}


def test_the_tokenizer_keeps_no_python_copy_of_its_vocabulary_and_still_round_trips(tmp_path):
    """transformers 5's Qwen2 class (a config of model_type qwen2 picks it) keeps the vocabulary
    and merges it built the Rust tokenizer from: 50 MB for Qwen's 151k tokens, dropped."""
    folder = tiny.save_model(tiny.random_model(seed=3), tmp_path / "m")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "qwen2"}))
    wrapper = draft_tokenizer(folder)
    assert type(wrapper._tokenizer).__name__ == "Qwen2Tokenizer"
    assert not {"_vocab", "_merges"} & vars(wrapper._tokenizer).keys()
    ids = wrapper.encode("héllo, wörld", add_special_tokens=False)
    assert wrapper.decode(ids) == "héllo, wörld"
