"""A derived GGUF folder loaded as an mlx-lm model: mlx-lm builds the model from config.json
(its own classes, quantized per module as the file's tensors are), the weights come from the
GGUF file."""

from __future__ import annotations

import os
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from macspec.errors import MacspecError
from macspec.models.gguf import layout as layouts
from macspec.models.gguf.archs import architecture_of
from macspec.models.gguf.config import quantization, rope_factors, to_mlx
from macspec.models.gguf.folder import check_types, gguf_entry
from macspec.models.gguf.header import GGUFHeader
from macspec.models.gguf.layout import Layout, default_layout
from macspec.models.gguf.report import Conversion, progress_callback, reported
from macspec.models.gguf.split import read_model_header
from macspec.models.gguf.tensors import (
    exactness,
    needs_conversion,
    read_tensors,
    resident_bytes,
    wide_scales,
)
from macspec.models.home import dead_leftovers

CONVERTED = {Layout.EXACT: "converted.safetensors", Layout.COMPACT: "compact.safetensors"}
"""The converted weights of a file mx.load cannot read, per layout, beside the derived
config.json (the folder is keyed by the file's identity, so a changed file gets another
folder)."""
PARTIAL = ".partial.safetensors"
"""The end of a converted copy's name while it is written (`compact.<pid>.partial.safetensors`):
never read, and deleted by the next conversion once its process is gone."""


def load_gguf_model(folder: Path, layout: Layout | None = None) -> nn.Module:
    """The model of a folder `gguf_folder` derived, in `layout` (default: `default_layout()`);
    one line when its file changed or went."""
    from mlx_lm.utils import load_model

    entry = gguf_entry(folder)
    if entry is None:
        raise MacspecError(f"{folder}: not a GGUF model folder")
    path = Path(entry["file"])
    header = read_model_header(path, strings=False)
    if header.identity() != entry.get("identity"):  # changed since this folder was derived
        raise MacspecError(f"{path}: changed since it was read; name the file again to reload it")
    check_types(header)
    layout = layout or default_layout()
    check_memory(header, layout)
    converting = needs_conversion(header) and not (folder / CONVERTED[layout]).is_file()
    weights = _converted_once(folder, header, layout)
    compact_on_cpu = layout is Layout.COMPACT and layouts.activation_dtype() == mx.float32
    wide = wide_scales(header) if compact_on_cpu and needs_conversion(header) else frozenset()
    if layout is Layout.COMPACT:
        weights = _in_activation_dtype(weights, wide)
        # Cast now, while nothing else is held: their float16 sources, freed into MLX's cache,
        # would otherwise sit on top of every other weight at the load's peak.
        mx.eval([weights[name] for name in wide & weights.keys()])
        mx.clear_cache()
    # A lazy, non-strict load reads no weights: the model as config.json describes it.
    model, config = load_model(
        folder,
        lazy=True,
        strict=False,
        model_config=quantization(header, weights),
        get_model_classes=architecture_of(header).model_classes(),
    )
    factors = rope_factors(header, weights)
    weights = to_mlx(header, config, weights)
    # No second model.sanitize: load_model ran it (on no weights), which did what it does to the
    # model itself (gemma3_text drops a tied lm_head, and a second call fails on it); to_mlx
    # gives mlx-lm's names already.
    try:
        model.load_weights(list(weights.items()), strict=True)
    except ValueError as exc:
        reason = " ".join(str(exc).split())
        raise MacspecError(f"{path}: its tensors do not fit its metadata ({reason})") from None
    if factors is not None:
        _set_rope_factors(model, factors)
    if wide:  # a converted file on a CPU
        _widen_looked_up_rows(model)
    mx.eval(model.parameters())
    try:  # the folder's time is when it was last used (`macspec cache` shows it)
        os.utime(folder)
    except OSError:
        pass
    exact, inexact = exactness(header, layout)
    resident = resident_bytes(header, layout)
    reported(Conversion(path, exact, inexact, converting, header.size, resident, layout.value))
    return model


def _in_activation_dtype(weights: dict[str, mx.array], wide: frozenset[str]) -> dict[str, mx.array]:
    """The weights as this machine's activations want them (by GGUF name). On a GPU, float32
    tensors (norms, biases, a float embedding) in float16, so no matmul widens its operands each
    pass. On the CPU, a converted file's `wide` scales in float32 (`wide_scales`: the output
    head's, or a tied embedding's), so no pass widens them afresh and no lookup makes the model
    compute in float16 (10-40x slower there, and rounded). A file `mx.load` reads computes as
    mlx-lm computes it."""
    dtype = layouts.activation_dtype()
    if dtype == mx.float32:
        widened = {
            name for name in wide & weights.keys() if weights[name].dtype == mx.float16
        }  # an MXFP4 head's scales are its own uint8 exponents
        return {
            name: value.astype(dtype) if name in widened else value
            for name, value in weights.items()
        }
    return {
        name: value.astype(dtype) if value.dtype == mx.float32 else value
        for name, value in weights.items()
    }


class WideRowsEmbedding(nn.QuantizedEmbedding):
    """A quantized embedding with float16 scales whose looked-up rows come out float32, as
    float32 scales would give them (float16 widens exactly), while the table keeps half the
    scale bytes: the CPU's compact token embedding when a separate head reads the output."""

    def __call__(self, x: mx.array) -> mx.array:
        biases = self.get("biases")
        return mx.dequantize(
            self["weight"][x],
            scales=self["scales"][x].astype(mx.float32),
            biases=None if biases is None else biases[x].astype(mx.float32),
            group_size=self.group_size,
            bits=self.bits,
            mode=self.mode,
        )


def _widen_looked_up_rows(model: nn.Module) -> None:
    """Every quantized embedding with float16 scales as a `WideRowsEmbedding` (same arrays)."""
    for module in model.modules():
        if type(module) is nn.QuantizedEmbedding and module["scales"].dtype == mx.float16:
            module.__class__ = WideRowsEmbedding  # a subclass that reads the same arrays


def check_memory(header: GGUFHeader, layout: Layout) -> None:
    """One line, before any weight is read, when the converted weights alone take more than
    this machine gives a model (what `macspec models` counts a pair's fit against)."""
    from macspec.models import memory

    need, limit = resident_bytes(header, layout), memory.usable_memory_bytes()
    if limit is not None and need > limit:
        raise MacspecError(
            f"{header.path}: its weights take {need / 1e9:.2f} GB in memory once converted "
            f"(the file {header.size / 1e9:.2f} GB), more than the {limit / 1e9:.2f} GB this "
            "machine gives a model; pick a smaller model or quantization"
        )


def _set_rope_factors(model: nn.Module, factors: mx.array) -> None:
    """Llama 3.1's scaling as llama.cpp applies it: each frequency's period times its factor."""
    for layer in model.model.layers:
        rope = layer.self_attn.rope
        dims = rope.dims
        base = model.args.rope_theta
        rope._freqs = (base ** (mx.arange(0, dims, 2) / dims)) * factors.astype(mx.float32)


def _converted_once(folder: Path, header: GGUFHeader, layout: Layout) -> dict[str, mx.array]:
    """The file's tensors: mx.load's types from the file itself; any other file converted once
    and cached in its derived folder, written whole (a temporary name, then a rename), so a
    second load reads it as fast as an mlx-lm folder."""
    if not needs_conversion(header):
        return read_tensors(header, layout)
    cache = folder / CONVERTED[layout]
    if cache.is_file():
        return mx.load(str(cache))
    _remove_dead_partials(folder, cache.stem)
    weights = read_tensors(header, layout, progress_callback())
    partial = folder / f"{cache.stem}.{os.getpid()}{PARTIAL}"
    try:
        mx.save_safetensors(str(partial), weights)
        os.replace(partial, cache)
    except (OSError, RuntimeError) as exc:  # MLX's full disk: "[write] Unable to write ..."
        reason = " ".join(str(exc).split())
        raise MacspecError(
            f"{folder}: cannot keep the converted copy ({reason}); free some disk space, or "
            "set MACSPEC_HOME to a folder on another disk"
        ) from None
    finally:
        partial.unlink(missing_ok=True)
    return weights


def _remove_dead_partials(folder: Path, stem: str) -> None:
    """Delete the temporary copies of conversions whose process is gone (killed mid-write: no
    `finally` ran), as large as the copy itself; one a live process is writing is kept."""
    for partial in dead_leftovers(folder, f"{stem}.", PARTIAL):
        partial.unlink(missing_ok=True)
