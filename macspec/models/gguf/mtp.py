"""The MTP layer a Qwen3.5/3.6 GGUF file carries as macspec's MTP drafter: a folder in the
file's derived folder, `mtp/` (`mtp-exact/` in the exact layout), in the format an MLX MTP
head has (mlx-vlm's `qwen3_5_mtp`: `fc`, `pre_fc_norm_*`, `norm`, `layers.N.*`), its weights
read from the file once and written whole.

convert_hf_to_gguf.py's _QwenMtpMixin (conversion/qwen.py) writes Hugging Face's `mtp.*` as
the blocks after the decoder's: `mtp.layers.i.*` as block `num_hidden_layers + i` with the
trunk's names and transformations; `mtp.fc`, `pre_fc_norm_embedding`, `pre_fc_norm_hidden` and
`norm` as `nextn.eh_proj`, `nextn.enorm`, `nextn.hnorm`, `nextn.shared_head_norm` of the first.
Every norm comes out + 1, as an MLX head's are, so the arch's own `undo` is all that is undone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx

from macspec.models.gguf.archs import ARCHITECTURES
from macspec.models.gguf.archs.qwen35 import PREFIX, Qwen35
from macspec.models.gguf.config import quantized_modules
from macspec.models.gguf.folder import GGUF_KEY, gguf_entry
from macspec.models.gguf.header import GGUFHeader
from macspec.models.gguf.layout import Layout, default_layout
from macspec.models.gguf.split import read_model_header
from macspec.models.gguf.tensors import read_tensors
from macspec.models.home import write_folder_whole

NEXTN_NAMES = {
    "nextn.eh_proj": "fc",
    "nextn.enorm": "pre_fc_norm_embedding",
    "nextn.hnorm": "pre_fc_norm_hidden",
    "nextn.shared_head_norm": "norm",
}
"""The MTP layer's own tensors: GGUF's names -> the head's (Hugging Face's without `mtp.`)."""
WEIGHTS = "model.safetensors"


def nextn_layers(header: GGUFHeader) -> int:
    """How many MTP layers a qwen35/qwen35moe file carries that macspec's MTP drafter runs
    (0 for any other architecture); the header's metadata alone answers."""
    arch = ARCHITECTURES.get(header.architecture)
    if not isinstance(arch, Qwen35):
        return 0
    count = header.arch_value("nextn_predict_layers")
    return count if isinstance(count, int) and count > 0 else 0


def head_folder(folder: Path, layout: Layout) -> Path:
    return folder / ("mtp" if layout is Layout.COMPACT else f"mtp-{layout.value}")


def gguf_mtp_head(folder: Path, layout: Layout | None = None) -> Path | None:
    """The MTP drafter folder of a derived GGUF folder whose file carries an MTP layer (made
    on first use, in `layout`: default `default_layout()`, the target's), or None."""
    entry = gguf_entry(folder)
    if entry is None:
        return None
    header = read_model_header(Path(entry["file"]), strings=False)
    if not nextn_layers(header):
        return None
    layout = layout or default_layout()
    head = head_folder(folder, layout)
    if not (head / "config.json").is_file():
        target = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        weights, config = mtp_weights(header, target, layout)

        def fill(partial: Path) -> None:
            mx.save_safetensors(str(partial / WEIGHTS), weights, metadata={"format": "mlx"})
            (partial / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")

        write_folder_whole(head, fill, "the MTP drafter folder")
    return head


def mtp_weights(
    header: GGUFHeader, target: dict[str, Any], layout: Layout
) -> tuple[dict[str, mx.array], dict[str, Any]]:
    """The MTP layer's tensors under the head's names, as the trunk's are converted, and the
    head's config.json (`target`: the derived folder's config)."""
    from macspec.models.drafters import mtp_head_config

    arch = ARCHITECTURES[header.architecture]
    first, count = target["num_hidden_layers"], nextn_layers(header)
    names = {
        name: head_name(arch, name, first)
        for name in header.tensors
        if name.startswith("blk.") and int(name.split(".")[1]) >= first
    }
    read = arch.fused(read_tensors(header, layout, names=names))
    weights = {
        head_name(arch, name, first): arch.undo(name, value, target) for name, value in read.items()
    }
    text = {k: v for k, v in target.items() if k != GGUF_KEY}
    config = mtp_head_config({**text, "mtp_num_hidden_layers": count})
    modules = {name: [head.removesuffix(".weight")] for name, head in names.items()}
    config.update(quantized_modules(header, read, modules))
    return weights, config


def head_name(arch: Qwen35, name: str, first: int) -> str:
    """`blk.{first + i}.attn_q.weight` -> `layers.i.self_attn.q_proj.weight`;
    `blk.{first}.nextn.eh_proj.weight` -> `fc.weight` (`.scales`, `.biases` alike)."""
    _, block, rest = name.split(".", 2)
    part, _, kind = rest.rpartition(".")
    if part in NEXTN_NAMES:
        return f"{NEXTN_NAMES[part]}.{kind}"
    mlx = arch.mlx_name(f"blk.{int(block) - first}.{rest}")
    return mlx.removeprefix(f"{PREFIX}model.")
