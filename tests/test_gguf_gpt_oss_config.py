"""gpt-oss's config from a GGUF's metadata beyond what the tiny oracle file writes (its fixed
pattern of 2, YaRN: tests/test_gguf_llamacpp.py): the layer pattern as llama.cpp's
`load_swa_pattern` reads a key, and the refusals, each one line."""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf import GGMLQuantizationType

from macspec.errors import MacspecError
from macspec.models.gguf.archs import architecture_of
from macspec.models.gguf.header import GGUFHeader, TensorEntry

PATH = Path("gpt-oss-20b.gguf")


def header(blocks: int = 4, **keys) -> GGUFHeader:
    """gpt-oss-20b's keys (as its published GGUF holds them) over `blocks` layers, and `keys`."""
    metadata = {
        "general.architecture": "gpt-oss",
        "block_count": blocks,
        "embedding_length": 2880,
        "feed_forward_length": 2880,
        "expert_feed_forward_length": 2880,
        "attention.head_count": 64,
        "attention.head_count_kv": 8,
        "attention.key_length": 64,
        "attention.sliding_window": 128,
        "expert_count": 32,
        "expert_used_count": 4,
        "rope.freq_base": 150000.0,
        "rope.scaling.type": "yarn",
        "rope.scaling.factor": 32.0,
        "rope.scaling.original_context_length": 4096,
        **keys,
    }
    metadata = {k if k.startswith("general.") else f"gpt-oss.{k}": v for k, v in metadata.items()}
    embed = TensorEntry("token_embd.weight", (201088, 2880), GGMLQuantizationType.F32, 0, 0, PATH)
    return GGUFHeader(PATH, 3, metadata, {embed.name: embed}, 0, 0)


def config(**keys) -> dict:
    built = header(**keys)
    return architecture_of(built).config(built)


def test_gpt_oss_20b_keys_give_mlx_lms_gpt_oss_config():
    read = config()
    assert read["model_type"] == "gpt_oss"
    assert (read["num_local_experts"], read["num_experts_per_tok"]) == (32, 4)
    assert (read["head_dim"], read["sliding_window"]) == (64, 128)
    assert read["layer_types"] == ["sliding_attention", "full_attention"] * 2
    # beta defaults as llama.cpp's (32, 1) when the file leaves them out
    assert read["rope_scaling"] == {
        "rope_type": "yarn",
        "factor": 32.0,
        "original_max_position_embeddings": 4096,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
    }


def test_a_pattern_key_is_read_as_llamacpp_reads_it():
    period = config(blocks=6, **{"attention.sliding_window_pattern": 3})["layer_types"]
    assert period == ["sliding_attention", "sliding_attention", "full_attention"] * 2
    flags = [True, False, False, True]
    per_layer = config(**{"attention.sliding_window_pattern": flags})["layer_types"]
    assert per_layer == [
        "sliding_attention",
        "full_attention",
        "full_attention",
        "sliding_attention",
    ]


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"attention.sliding_window_pattern": [True] * 4}, "both sliding and full layers"),
        ({"attention.sliding_window_pattern": [True, False]}, "one flag per layer"),
        ({"rope.scaling.type": "longrope"}, "rope scaling 'longrope' is not supported"),
    ],
)
def test_what_mlx_lms_class_cannot_hold_is_one_line(keys, message):
    with pytest.raises(MacspecError, match=message):
        config(**keys)
