"""gpt-oss as convert_hf_to_gguf.py writes a float checkpoint of it (GptOssModel, gpt-oss-20b's
shape: biases on every projection, attention sinks `attn_sinks`, a router with a bias, experts
stacked and transposed to (E, out, in), gate and up taken apart from their interleaved columns,
sliding and full layers alternating, YaRN rope keys). The published files' MXFP4 experts are not
in this tiny file. llama.cpp's answer is recorded (tests/fixtures/llamacpp/gpt-oss.json).
macspec refuses the architecture in one line for now; once it reads it, "gpt-oss" joins
SUPPORTED in tests/test_gguf_llamacpp.py and this file goes."""

from __future__ import annotations

import pytest
from oraclekit import macspec_steps, rebuilt

from macspec.errors import MacspecError


def test_gpt_oss_is_refused_in_one_line_naming_it(tmp_path):
    path = rebuilt("gpt-oss", tmp_path)
    with pytest.raises(MacspecError, match=r"architecture 'gpt-oss' is not supported"):
        macspec_steps(path, tmp_path / "home", [[1]], 1)
