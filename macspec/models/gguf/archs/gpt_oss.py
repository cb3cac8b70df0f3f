"""gpt-oss (gpt-oss-20b, gpt-oss-120b) as mlx-lm's `gpt_oss`.

convert_hf_to_gguf.py's GptOssModel (conversion/gpt_oss.py) takes the checkpoint's interleaved
`gate_up_proj` apart (even columns gate, odd up: as mlx-lm's `sanitize` does) and stores each
projection's experts as [experts, out, in] (`ffn_{gate,up,down}_exps`, with biases [experts,
out]): the layout of mlx-lm's SwitchGLU, so nothing to undo. MXFP4 experts are repacked into
ggml's MXFP4 blocks, which kquants reads as MLX's `mxfp4` mode exactly. The router is
`ffn_gate_inp` (with a bias), the attention sinks `attn_sinks.weight` (mlx-lm's `sinks`).

llama.cpp's graph (src/models/openai-moe.cpp): sliding and full layers alternate (`load_swa_
pattern(ml, 2)`: the first of each pair slides unless the file says otherwise), YaRN from the
`rope.scaling.*` keys, top-k of the router's logits then softmax over them, SwiGLU-OAI.
"""

from __future__ import annotations

from typing import Any

from macspec.errors import MacspecError
from macspec.models.gguf.archs.base import LAYER_NAMES, Architecture, Metadata
from macspec.models.gguf.header import GGUFHeader

EXPERT_PROJECTIONS = {
    "ffn_gate_exps": "gate_proj",
    "ffn_up_exps": "up_proj",
    "ffn_down_exps": "down_proj",
}
"""The stacked experts: mlx-lm's gpt_oss names its SwitchGLU `experts`."""
GPT_OSS_NAMES = {
    **LAYER_NAMES,
    **{part: f"mlp.experts.{proj}" for part, proj in EXPERT_PROJECTIONS.items()},
    "ffn_gate_inp": "mlp.router",
    "attn_sinks": "self_attn.sinks",
    "post_attention_norm": "post_attention_layernorm",
}
SLIDING_PATTERN = 2
"""llama.cpp's period of sliding layers without a key: one full layer every second."""


class GptOss(Architecture):
    name, model_type = "gpt-oss", "gpt_oss"
    layer_names = GPT_OSS_NAMES
    own_rope_scalings = ("yarn",)

    def extra_config(
        self, header: GGUFHeader, key: Metadata, config: dict[str, Any]
    ) -> dict[str, Any]:
        blocks = config["num_hidden_layers"]
        extra: dict[str, Any] = {
            "num_local_experts": int(key("expert_count")),
            "num_experts_per_tok": int(key("expert_used_count")),
            "intermediate_size": int(key("expert_feed_forward_length")),
            "sliding_window": int(key("attention.sliding_window")),
            "layer_types": _layer_types(header, key, blocks),
            "rope_scaling": None,
        }
        if key.get("rope.scaling.type") == "yarn":
            extra["rope_scaling"] = {
                "rope_type": "yarn",
                "factor": float(key("rope.scaling.factor")),
                "original_max_position_embeddings": int(
                    key("rope.scaling.original_context_length")
                ),
                "beta_fast": float(key("rope.scaling.yarn_beta_fast", 32.0)),
                "beta_slow": float(key("rope.scaling.yarn_beta_slow", 1.0)),
            }
        return extra

    def mlx_name(self, name: str) -> str:
        # mlx-lm's sinks are an array of the attention module, not a module's weight
        return super().mlx_name(name).replace(".sinks.weight", ".sinks")


def _layer_types(header: GGUFHeader, key: Metadata, blocks: int) -> list[str]:
    """llama.cpp's `load_swa_pattern`: one bool per layer (true where it slides), or a period
    N (layer i slides where i % N < N - 1), 2 without the key. mlx-lm's class needs both kinds."""
    pattern = key.get("attention.sliding_window_pattern")
    if pattern is None or isinstance(pattern, int):
        period = SLIDING_PATTERN if pattern is None else int(pattern)
        sliding = [period == 0 or i % period < period - 1 for i in range(blocks)]
    else:
        sliding = [bool(value) for value in pattern]
    if len(sliding) != blocks or all(sliding) or not any(sliding):
        raise MacspecError(
            f"{header.path}: gpt-oss needs both sliding and full layers, one flag per layer"
        )
    return ["sliding_attention" if slides else "full_attention" for slides in sliding]
