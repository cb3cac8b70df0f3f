"""Quantizing a module the way its saved arrays were packed: the settings a config names for a
module, else those mlx-lm infers from the arrays; nvfp4 with a global scale (NVIDIA ModelOpt's
double scale, as Ollama's x/create stores it: `X.weight.global_scale`, F32, the dequantizing
multiplier) applied as Ollama's runner applies it. Serves the Ollama MLX loader and the drafter
heads alike."""

from __future__ import annotations

import inspect
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_unflatten

from macspec.errors import MacspecError


class GlobalScaledLinear(nn.QuantizedLinear):
    """A quantized linear layer with a global scale: the quantized product times the scale
    (per tensor, or per output row), cast back, then the bias, as Ollama's x/models/nn
    QuantizedLinear.Forward computes it (MLX's quantized_matmul takes no global scale)."""

    def __call__(self, x: mx.array) -> mx.array:
        out = mx.quantized_matmul(
            x,
            self["weight"],
            scales=self["scales"],
            biases=self.get("biases"),
            transpose=True,
            group_size=self.group_size,
            bits=self.bits,
            mode=self.mode,
        )
        out = (out * self["global_scale"]).astype(out.dtype)
        if "bias" in self:
            out = out + self["bias"].astype(out.dtype)
        return out


class GlobalScaledEmbedding(nn.QuantizedEmbedding):
    """A quantized embedding with a global scale: rows dequantized then scaled, and as a linear
    layer (tied heads) the quantized product then scaled (x/models/nn QuantizedEmbedding)."""

    def __call__(self, x: mx.array) -> mx.array:
        rows = super().__call__(x)
        scale = self["global_scale"]
        scale = scale if scale.size == 1 else scale[x][..., None]
        return (rows * scale).astype(rows.dtype)

    def as_linear(self, x: mx.array) -> mx.array:
        out = super().as_linear(x)
        return (out * self["global_scale"]).astype(out.dtype)


_SCALED = {nn.QuantizedLinear: GlobalScaledLinear, nn.QuantizedEmbedding: GlobalScaledEmbedding}


def _takes_global_scale(module: nn.Module) -> bool:
    """Whether a layer's own quantized form holds a global scale (mlx-lm's switch layers, in
    MLX's convention: the tensor's amax, 6 * 448 times Ollama's stored multiplier)."""
    return "global_scale" in inspect.signature(module.to_quantized).parameters


def _with_global_scale(path: str, module: nn.Module, scale: mx.array) -> nn.Module:
    """A quantized layer as its global-scaled kind, its arrays kept (the scale's own shape, so
    that the saved one loads strictly)."""
    kind = _SCALED.get(type(module))
    if kind is None:
        raise MacspecError(f"{path}: a global scale on a {type(module).__name__} layer")
    scaled = kind.__new__(kind)
    nn.Module.__init__(scaled)
    dict.update(scaled, module)  # its arrays and sublayers, as they are
    for name in ("group_size", "bits", "mode", "num_embeddings", "dims"):
        if hasattr(module, name):
            setattr(scaled, name, getattr(module, name))
    scaled.global_scale = mx.ones(scale.shape, mx.float32)
    scaled.freeze()
    return scaled


def quantize_as_saved(
    module: nn.Module, quantization: dict[str, Any] | None, weights: dict[str, mx.array]
) -> None:
    """Quantize the layers `weights` holds scales for, as mlx_lm.load does: with the settings
    `quantization` names for a layer, else as mlx-lm infers them from its arrays (a path a
    sanitize renamed); a layer with a `global_scale` array made to apply it."""
    if not quantization:
        return
    from mlx_lm.utils import infer_quant_config

    scaled: list[str] = []

    def predicate(path: str, layer: nn.Module) -> dict | bool:
        settings = quantization.get(path)
        if not isinstance(settings, dict):
            if f"{path}.scales" not in weights or not hasattr(layer, "to_quantized"):
                return False
            settings = infer_quant_config(path, layer, weights)
        if f"{path}.global_scale" in weights:
            if _takes_global_scale(layer):  # MLX's gather_qmm takes amax, not the multiplier
                raise MacspecError(
                    f"{path}: stacked experts with an nvfp4 global scale are not supported yet"
                )
            scaled.append(path)
        return settings

    nn.quantize(
        module,
        group_size=quantization["group_size"],
        bits=quantization["bits"],
        mode=quantization.get("mode", "affine"),
        class_predicate=predicate,
    )
    if scaled:
        layers = dict(module.named_modules())
        replaced = [
            (p, _with_global_scale(p, layers[p], weights[f"{p}.global_scale"])) for p in scaled
        ]
        module.update_modules(tree_unflatten(replaced))
