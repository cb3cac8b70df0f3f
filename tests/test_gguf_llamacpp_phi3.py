"""Phi-3 and Phi-4 as convert_hf_to_gguf.py writes them (Phi3MiniModel, here Phi-4-mini's shape:
grouped KV heads, rotary on 3/4 of each head, tied output, sliding window 0): Q, K and V fused
in `attn_qkv`, gate and up fused in `ffn_up` (gate first), as the checkpoint holds them and as
mlx-lm's phi3 reads them (`qkv_proj`, `gate_up_proj`). llama.cpp's answer on the tiny file is
recorded (tests/fixtures/llamacpp/phi3.json). macspec refuses the architecture in one line for
now; once it reads it, "phi3" joins SUPPORTED in tests/test_gguf_llamacpp.py and this file goes."""

from __future__ import annotations

import pytest
from oraclekit import macspec_steps, rebuilt

from macspec.errors import MacspecError


def test_phi3_is_refused_in_one_line_naming_it(tmp_path):
    path = rebuilt("phi3", tmp_path)
    with pytest.raises(MacspecError, match=r"architecture 'phi3' is not supported"):
        macspec_steps(path, tmp_path / "home", [[1]], 1)
