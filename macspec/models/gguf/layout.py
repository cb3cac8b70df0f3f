"""Which MLX layout a GGUF file's tensors take in memory.

On a Mac, decoding reads every weight once per target pass: the bytes held are the speed.
llama.cpp and Ollama hold a GGUF at its own size, so macspec's default does too:

- **compact** (the default): every type with an affine form of group 32 (Q4_K, Q5_K, Q4_0,
  Q4_1, Q5_0, Q5_1, Q8_0) keeps its bits, with float16 scales and biases (Q4_K's and Q5_K's
  `d*sc` rounded to float16: 17 significant bits into 11); the types without one (Q6_K, Q3_K,
  Q2_K, most i-quants) are requantized into the affine layout `REQUANTIZED` gives (IQ4_NL and
  IQ4_XS map onto 8-bit groups exactly); MXFP4 is
  MLX's own `mxfp4`. Measured on Gemma 3 270M Q4_K_M and Qwen2.5-Coder 1.5B Q4_K_M
  (docs/models.md, "GGUF at the file's size").
- **exact** (on request: `--gguf-layout exact`, `MACSPEC_GGUF_LAYOUT=exact`, or
  `gguf_layout = "exact"` in models.toml):
  float32 scales and biases, the types without an affine form as float16, so the affine
  types dequantize to gguf's float32 values bit for bit, at about 1.7x the file's bytes.

The activations: float16 where MLX runs on a GPU (a Mac); float32 on a CPU, where MLX's
half-precision quantized matmul is 10-40x slower than its float32 one (measured here: a 4-bit
2048x2048 matvec 5.4 ms in float32, 194 ms in float16). There each matmul widens its group's
float16 scales (1/8 of a 4-bit weight's bytes as float32), never the weights themselves.
"""

from __future__ import annotations

import os
from enum import Enum

import mlx.core as mx
from gguf import GGMLQuantizationType as Q

from macspec.errors import MacspecError


class Layout(str, Enum):
    COMPACT = "compact"
    EXACT = "exact"


LAYOUTS = tuple(layout.value for layout in Layout)

REQUANTIZED_DEFAULT = (8, 32)
"""(bits, group size) of a type without an affine form, in the compact layout: 8-bit groups of
32 hold Q6_K's values within a quarter of its own step (9 bits a weight against its 6.56;
float16 would be 16). Measured against the float32 reference: docs/models.md."""
REQUANTIZED: dict[Q, tuple[int, int]] = {Q.IQ4_NL: (8, 32), Q.IQ4_XS: (8, 32)}
"""Per type, where one differs from REQUANTIZED_DEFAULT. IQ4_NL and IQ4_XS are not requantized
but mapped: their codebook values are integers spanning 240, an exact 8-bit code in groups of
32 (`kquants.CODEBOOK_AFFINE`)."""

LAYOUT_ENV = "MACSPEC_GGUF_LAYOUT"
"""The environment's layout (what --gguf-layout reads when not given): commands without the
flag, such as `macspec models`, count the bytes of the layout a run would take."""
_default: Layout | None = None
"""Set by a command's --gguf-layout or its pair's gguf_layout; else the environment's."""


def parse_layout(value: str | Layout) -> Layout:
    """A layout from its name; one line naming the choices otherwise."""
    try:
        return Layout(value)
    except ValueError:
        raise MacspecError(
            f"--gguf-layout must be one of {', '.join(LAYOUTS)}, got {value!r}"
        ) from None


def set_default_layout(value: str | Layout) -> None:
    """The layout every later GGUF load takes (the CLI's --gguf-layout, a pair's gguf_layout):
    process-wide, as the device MLX runs on is, so a load in a server's worker thread sees it."""
    global _default
    _default = parse_layout(value)


def default_layout() -> Layout:
    if _default is not None:
        return _default
    value = os.environ.get(LAYOUT_ENV) or Layout.COMPACT
    try:
        return Layout(value)
    except ValueError:
        raise MacspecError(
            f"{LAYOUT_ENV} must be one of {', '.join(LAYOUTS)}, got {value!r}"
        ) from None


def requantized(qtype: Q) -> tuple[int, int]:
    """(bits, group size) of a type without an affine form, in the compact layout."""
    return REQUANTIZED.get(qtype, REQUANTIZED_DEFAULT)


def scales_dtype(layout: Layout) -> mx.Dtype:
    return mx.float16 if layout is Layout.COMPACT else mx.float32


def activation_dtype() -> mx.Dtype:
    """What a compact model computes in on this machine (see the module's docstring)."""
    return mx.float16 if mx.default_device() == mx.gpu else mx.float32
