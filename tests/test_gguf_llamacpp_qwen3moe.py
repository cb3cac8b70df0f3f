"""Qwen3's MoE (Qwen3-30B-A3B, Qwen3-Coder-30B-A3B) as convert_hf_to_gguf.py writes it: experts
stacked per projection (`ffn_gate_exps`, `ffn_up_exps`, `ffn_down_exps`), a router
(`ffn_gate_inp`), `expert_count`, `expert_used_count`, `expert_feed_forward_length`.
llama.cpp's answer on the tiny file is recorded (tests/fixtures/llamacpp/qwen3moe.json). macspec
refuses the architecture in one line for now; once it reads it, "qwen3moe" joins SUPPORTED in
tests/test_gguf_llamacpp.py and this file goes."""

from __future__ import annotations

import pytest
from oraclekit import macspec_steps, rebuilt

from macspec.errors import MacspecError


def test_qwen3moe_is_refused_in_one_line_naming_it(tmp_path):
    path = rebuilt("qwen3moe", tmp_path)
    with pytest.raises(MacspecError, match=r"architecture 'qwen3moe' is not supported.*qwen3"):
        macspec_steps(path, tmp_path / "home", [[1]], 1)
