"""A tiny random DFlash drafter folder in z-lab's format, for tests and figure scripts (read
through `tiny`, which re-exports it beside the models it drafts for)."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten, tree_map


def dflash_config(target_layer_ids=(0, 1), block_size: int = 8, mask: int = 259) -> dict:
    return dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=128,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        max_position_embeddings=4096,
        block_size=block_size,
        num_target_layers=4,
        dflash_config=dict(mask_token_id=mask, target_layer_ids=list(target_layer_ids)),
    )


def save_dflash_folder(folder: Path, seed: int = 3, **config) -> Path:
    """A DFlash drafter folder in z-lab's format, random weights."""
    from macspec.engine.drafters.dflash import DFlashConfig, DFlashModel

    folder.mkdir(parents=True, exist_ok=True)
    full = dflash_config(**config)
    mx.random.seed(seed)
    model = DFlashModel(DFlashConfig.from_dict(full), 64)
    model.update(tree_map(lambda w: w * 2.0 if w.ndim == 2 else w, model.parameters()))
    mx.eval(model.parameters())
    (folder / "config.json").write_text(json.dumps(full))
    mx.save_safetensors(str(folder / "model.safetensors"), dict(tree_flatten(model.parameters())))
    return folder
