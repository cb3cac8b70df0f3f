"""gemma3n (Gemma 3n E2B and E4B: AltUp's four streams, LAuReL, per-layer embeddings, layers that
reuse an earlier layer's keys and values) as mlx-lm's `gemma3n`.

convert_hf_to_gguf.py's Gemma3NModel stores norms as they are (no +1: Gemma 3n's RMSNorm
multiplies by w), pads both embeddings to the full vocabulary with zero rows, and stacks the
three AltUp projections (and the three unembedding ones) into one [3, hidden, hidden] tensor.

llama.cpp (src/models/gemma3n.cpp, models.h) reads few of the keys the converter writes and
fixes the rest: the first 20 layers hold keys and values (later ones reuse layer 18's if
sliding, 19's if global), the first 10 layers' gate keeps what is 1.645 standard deviations
above its mean (activation sparsity 0.95), the final logits are softcapped at 30, queries are
not scaled, AltUp's coefficients are not clipped, every 5th layer is global without a pattern
key. The config below is what llama.cpp computes, so that macspec answers as it does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import mlx.core as mx

from macspec.errors import MacspecError
from macspec.models.gguf.archs.base import LAYER_NAMES, Architecture, Metadata
from macspec.models.gguf.header import GGUFHeader

KV_LAYERS = 20
"""llama.cpp's `n_layer_kv_from_start`: layers from the 21st on reuse an earlier layer's cache."""
SPARSE_LAYERS, SPARSITY = 10, 0.95
"""llama.cpp's `n_layer_sparsity` and the sparsity its `f_sparsity_std_mul` stands for."""
SOFTCAP = 30.0
"""llama.cpp's default final logit softcap, which gemma3n never reads from the file."""
NO_CLIP = 3.4028234663852886e38
"""AltUp's coefficient clip as the largest float32, so none is (llama.cpp clips none; the
config must hold a number for transformers, which macspec's tokenizer loading reads it with)."""
GLOBAL_EVERY = 5
PREFIX = "model.language_model"
TOP = {
    "token_embd": "embed_tokens",
    "per_layer_token_embd": "embed_tokens_per_layer",
    "per_layer_model_proj": "per_layer_model_projection",
    "per_layer_proj_norm": "per_layer_projection_norm",
    "output_norm": "norm",
}
STACKED = {"altup_proj": "altup_projections", "altup_unembd_proj": "altup_unembed_projections"}
"""Each one tensor of AltUp's three [hidden, hidden] projections (mlx-lm keeps three Linears)."""
LAYER = {
    **LAYER_NAMES,
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
    "inp_gate": "per_layer_input_gate",
    "proj": "per_layer_projection",
    "post_norm": "post_per_layer_input_norm",
    "altup_correct_coef": "altup.correction_coefs",
    "altup_predict_coef": "altup.prediction_coefs",
    "altup_router": "altup.modality_router",
    "altup_router_norm": "altup.router_norm",
    "laurel_l": "laurel.linear_left",
    "laurel_r": "laurel.linear_right",
    "laurel_post_norm": "laurel.post_laurel_norm",
}


class Gemma3n(Architecture):
    name, model_type = "gemma3n", "gemma3n"
    layer_names = LAYER
    default_rope_base = 1_000_000.0

    def config(self, header: GGUFHeader) -> dict[str, Any]:
        """mlx-lm's gemma3n reads a multimodal config: the text model's under `text_config`."""
        if "output.weight" in header.tensors:
            raise MacspecError(f"{header.path}: a gemma3n file with its own output matrix")
        text = super().config(_with_ollama_keys(header))
        return {"model_type": self.model_type, "text_config": text}

    def extra_config(
        self, header: GGUFHeader, key: Metadata, config: dict[str, Any]
    ) -> dict[str, Any]:
        blocks = config["num_hidden_layers"]
        layer_types = _layer_types(header, key, blocks)
        _check_shared_kv(header, layer_types)
        widths = key.get("feed_forward_lengths")
        ff = config["intermediate_size"] if widths is None or len(set(widths)) == 1 else widths
        per_layer = header.tensors["per_layer_token_embd.weight"].shape
        return {
            "model_type": "gemma3n_text",
            "intermediate_size": ff,
            "layer_types": layer_types,
            "sliding_window": int(key("attention.sliding_window")),
            "rope_local_base_freq": float(
                key("rope.freq_base_swa", key("rope.freq_base_local", 10_000.0))
            ),
            "num_kv_shared_layers": max(0, blocks - KV_LAYERS),
            # llama.cpp looks every id up in the padded table (zero rows past the text ids)
            "vocab_size_per_layer_input": int(per_layer[0]),
            "hidden_size_per_layer_input": int(per_layer[1]) // blocks,
            "laurel_rank": int(header.tensors["blk.0.laurel_l.weight"].shape[0]),
            "activation_sparsity_pattern": [
                SPARSITY if i < SPARSE_LAYERS else 0.0 for i in range(blocks)
            ],
            "final_logit_softcapping": SOFTCAP,
            "altup_num_inputs": int(key("altup.num_inputs", 4)),
            "altup_active_idx": int(key("altup.active_idx", 0)),
            "altup_coef_clip": NO_CLIP,
            "altup_correct_scale": True,
        }

    def mlx_name(self, name: str) -> str:
        stem, _, kind = name.rpartition(".")
        if stem in TOP:
            return f"{PREFIX}.{TOP[stem]}.{kind}"
        if stem.endswith(".altup_correct_scale"):  # a plain array in mlx-lm, not a module
            return f"{PREFIX}.layers.{stem.split('.')[1]}.altup.correct_output_scale"
        return f"{PREFIX}.{super().mlx_name(name).removeprefix('model.')}"

    def mlx_tensors(
        self, name: str, value: mx.array, config: dict[str, Any]
    ) -> Iterator[tuple[str, mx.array]]:
        stem, _, kind = name.rpartition(".")
        if stem not in STACKED:
            yield from super().mlx_tensors(name, value, config)
            return
        for i in range(value.shape[0]):
            yield f"{PREFIX}.{STACKED[stem]}.{i}.{kind}", value[i]

    def mlx_modules(self, name: str) -> list[str]:
        stem = name.rpartition(".")[0]
        if stem in STACKED:
            return [f"{PREFIX}.{STACKED[stem]}.{i}" for i in range(3)]
        return super().mlx_modules(name)

    def model_classes(self) -> Callable[[dict], tuple[type, type]]:
        return _model_classes


def _model_classes(config: dict) -> tuple[type, type]:
    """mlx-lm's gemma3n, whose sanitize (dropping the vision and audio towers) fails on the no
    weights mlx-lm's loader gives it here: the GGUF's tensors come under mlx-lm's names."""
    from mlx_lm.models import gemma3n

    class Model(gemma3n.Model):
        def sanitize(self, weights: dict) -> dict:
            return weights

    return Model, gemma3n.ModelArgs


def _with_ollama_keys(header: GGUFHeader) -> GGUFHeader:
    """Ollama's convert_gemma3n.go names the head size `gemma3n.head_dim` (llama.cpp's converter
    `attention.key_length`), and may write the feed-forward width once per layer; the header as
    the common keys read it (the per-layer widths stay for `extra_config`)."""
    meta, extra = header.metadata, {}
    if "gemma3n.attention.key_length" not in meta and "gemma3n.head_dim" in meta:
        extra["gemma3n.attention.key_length"] = meta["gemma3n.head_dim"]
    widths = meta.get("gemma3n.feed_forward_length")
    if widths is not None and not isinstance(widths, int):
        extra["gemma3n.feed_forward_length"] = max(int(n) for n in widths)
        extra["gemma3n.feed_forward_lengths"] = [int(n) for n in widths]
    return replace(header, metadata={**meta, **extra}) if extra else header


def _layer_types(header: GGUFHeader, key: Metadata, blocks: int) -> list[str]:
    """llama.cpp's `load_swa_pattern(ml, 5)`: one bool per layer, true where it is local, or
    a period (every 5th layer global without one)."""
    pattern = key.get("attention.sliding_window_pattern")
    if pattern is None or isinstance(pattern, int):
        period = GLOBAL_EVERY if pattern is None else int(pattern)
        local = [(i + 1) % period != 0 for i in range(blocks)]
    else:
        local = [bool(v) for v in pattern]
    if len(local) != blocks or all(local) or not any(local):
        raise MacspecError(f"{header.path}: a gemma3n sliding-window pattern macspec cannot read")
    return ["sliding_attention" if v else "full_attention" for v in local]


def _check_shared_kv(header: GGUFHeader, layer_types: list[str]) -> None:
    """llama.cpp's later layers reuse layer 18's cache if sliding, 19's if global; mlx-lm's the
    last cached layer's of their kind: the same layers where 18 is local and 19 global."""
    if len(layer_types) > KV_LAYERS and layer_types[KV_LAYERS - 2 : KV_LAYERS] != [
        "sliding_attention",
        "full_attention",
    ]:
        raise MacspecError(f"{header.path}: gemma3n layers 18-19 not local then global")
