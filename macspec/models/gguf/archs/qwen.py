"""qwen2 (Qwen 2/2.5) and qwen3 (dense Qwen 3): convert_hf_to_gguf.py's Qwen2Model and
Qwen3Model only rename their tensors (Q/K/V biases for qwen2, Q/K norms for qwen3)."""

from __future__ import annotations

from macspec.models.gguf.archs.base import Architecture


class Qwen2(Architecture):
    name, model_type = "qwen2", "qwen2"


class Qwen3(Architecture):
    name, model_type = "qwen3", "qwen3"
