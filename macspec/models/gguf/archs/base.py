"""What every GGUF architecture shares: the metadata keys of a decoder (llama.cpp writes them
as `{arch}.embedding_length`, ...), the per-layer tensor names (`blk.N.attn_q`), and the hooks an
architecture overrides: its own keys, a converter's change to a tensor undone, tensors that are
not the text model's."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import mlx.core as mx
import numpy as np

from macspec.errors import MacspecError
from macspec.models.gguf.header import GGUFHeader

LAYER_NAMES: Mapping[str, str] = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_norm": "input_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_norm": "post_attention_layernorm",
}
EXPERT_NAMES: Mapping[str, str] = {
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_exps": "mlp.switch_mlp.gate_proj",
    "ffn_up_exps": "mlp.switch_mlp.up_proj",
    "ffn_down_exps": "mlp.switch_mlp.down_proj",
}
"""A mixture of experts' router and stacked experts ([experts, out, in], as mlx-lm's SwitchGLU
holds them) in llama.cpp's MoE architectures."""


def routed_experts(key: Metadata) -> dict[str, Any]:
    """mlx-lm's entries for llama.cpp's Qwen MoE graphs: softmax routing, the top-k weights
    renormalized always (no `norm_topk_prob` key is written), every layer sparse."""
    return {
        "num_experts": int(key("expert_count")),
        "num_experts_per_tok": int(key("expert_used_count")),
        "moe_intermediate_size": int(key("expert_feed_forward_length")),
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
    }


TOP_NAMES: Mapping[str, str] = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_LAYER = re.compile(r"blk\.(\d+)\.([a-z_0-9]+)\.(weight|bias|scales|biases)")
_TOP = re.compile(r"([a-z_0-9]+)\.(weight|bias|scales|biases)")


def _largest(count: Any) -> int:
    """A count the file gives once or per layer (a hybrid's KV heads: 0 on its recurrent
    layers): the attention layers' own."""
    return int(np.max(count))


class Metadata:
    """`{arch}.KEY` values of one file, a missing one without a default one line."""

    def __init__(self, header: GGUFHeader):
        self.header, self.arch = header, header.architecture

    def __call__(self, name: str, default: Any = None) -> Any:
        value = self.header.metadata.get(f"{self.arch}.{name}", default)
        if value is None:
            raise MacspecError(f"{self.header.path}: no {self.arch}.{name} in the metadata")
        return value

    def get(self, name: str) -> Any:
        return self.header.metadata.get(f"{self.arch}.{name}")


class Architecture:
    """A GGUF architecture read as one of mlx-lm's model classes. The defaults are a plain
    llama-like decoder as llama.cpp's converter writes it (qwen2 and qwen3 need nothing more)."""

    name = ""
    """GGUF's `general.architecture`."""
    model_type = ""
    """mlx-lm's model class (config.json's `model_type`)."""
    layer_names: Mapping[str, str] = LAYER_NAMES
    default_rope_base = 10_000.0
    own_rope_scalings: tuple[str, ...] = ()
    """`rope.scaling.type` values `extra_config` reads itself (the base reads linear only)."""

    def config(self, header: GGUFHeader) -> dict[str, Any]:
        """config.json for mlx-lm's class: the keys every decoder has, then `extra_config`'s."""
        key = Metadata(header)
        embed = header.tensors.get("token_embd.weight")
        if embed is None:
            raise MacspecError(f"{header.path}: no token_embd.weight (not a language model?)")
        heads, hidden = int(key("attention.head_count")), int(key("embedding_length"))
        config: dict[str, Any] = {
            "model_type": self.model_type,
            "hidden_size": hidden,
            "num_hidden_layers": int(key("block_count")),
            "intermediate_size": self.feed_forward_length(key),
            "num_attention_heads": heads,
            "num_key_value_heads": _largest(key("attention.head_count_kv", heads)),
            "head_dim": int(key("attention.key_length", hidden // heads)),
            "rms_norm_eps": float(key("attention.layer_norm_rms_epsilon", 1e-6)),
            "vocab_size": int(embed.shape[0]),
            "max_position_embeddings": int(key("context_length", 4096)),
            "rope_theta": float(key("rope.freq_base", self.default_rope_base)),
            "tie_word_embeddings": "output.weight" not in header.tensors,
        }
        scaling = key.get("rope.scaling.type")
        if scaling == "linear":
            config["rope_scaling"] = {"type": "linear", "factor": float(key("rope.scaling.factor"))}
        elif scaling not in (None, "none", *self.own_rope_scalings):
            raise MacspecError(f"{header.path}: rope scaling '{scaling}' is not supported yet")
        config.update(self.extra_config(header, key, config))
        return config

    def feed_forward_length(self, key: Metadata) -> int:
        """The dense MLP's width (a file of experts alone may have none)."""
        return int(key("feed_forward_length"))

    def extra_config(
        self, header: GGUFHeader, key: Metadata, config: dict[str, Any]
    ) -> dict[str, Any]:
        """This architecture's own config entries (given the common ones)."""
        return {}

    def mlx_name(self, name: str) -> str:
        """`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`."""
        match = _LAYER.fullmatch(name)
        if match and match.group(2) in self.layer_names:
            index, part, kind = match.groups()
            return f"model.layers.{index}.{self.layer_names[part]}.{kind}"
        match = _TOP.fullmatch(name)
        if match and match.group(1) in TOP_NAMES:
            return f"{TOP_NAMES[match.group(1)]}.{match.group(2)}"
        raise MacspecError(f"a tensor macspec does not know in a {self.name} file: {name}")

    def is_config(self, name: str) -> bool:
        """A tensor that configures the model rather than being one of its weights."""
        return False

    def is_unused(self, name: str, header: GGUFHeader) -> bool:
        """A tensor of the file that the text model macspec builds does not read (an MTP layer)."""
        return False

    def notices(self, header: GGUFHeader) -> list[str]:
        """What the user should know about the file that is not an error (a part not used)."""
        return []

    def fused(self, weights: dict[str, mx.array]) -> dict[str, mx.array]:
        """The file's tensors (by GGUF name) with those mlx-lm holds in one module joined, under
        a name `mlx_name` maps to it (the converter split them)."""
        return weights

    def undo(self, name: str, value: mx.array, config: dict[str, Any]) -> mx.array:
        """The tensor as the original checkpoint held it: the converter's change undone."""
        return value

    def rope_factors(self, weights: Mapping[str, mx.array]) -> mx.array | None:
        return None

    def mlx_tensors(
        self, name: str, value: mx.array, config: dict[str, Any]
    ) -> Iterator[tuple[str, mx.array]]:
        """The GGUF tensor as mlx-lm's weights: one, unless the converter stacked several."""
        yield self.mlx_name(name), self.undo(name, value, config)

    def mlx_modules(self, name: str) -> list[str]:
        """The mlx-lm modules the GGUF tensor `name` is the weight of (their quantization)."""
        return [self.mlx_name(name).removesuffix(".weight")]

    def model_classes(self) -> Callable[[dict], tuple[type, type]]:
        """mlx-lm's model and argument classes for a config (an architecture whose mlx-lm
        class does not load a GGUF's weights gives its own)."""
        from mlx_lm.utils import _get_classes

        return _get_classes
