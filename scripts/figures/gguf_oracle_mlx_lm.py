"""mlx-lm's own model class on a tiny oracle GGUF's tensors, only renamed, against llama.cpp's
recorded answer (tests/fixtures/llamacpp): ids equal and the largest logit difference, for the
architectures macspec does not read yet (docs/models.md, note 3 of the llama.cpp table).

    python scripts/figures/gguf_oracle_mlx_lm.py qwen3moe phi3
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402
import oraclekit  # noqa: E402
from ggufkit import NAMES  # noqa: E402
from mlx_lm.models.cache import make_prompt_cache  # noqa: E402
from mlx_lm.utils import _get_classes  # noqa: E402
from test_gguf_llamacpp import max_logit_difference  # noqa: E402

LAYER = {**NAMES, "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
EXTRA = {  # per architecture: mlx-lm's model_type and config, and the names beyond LAYER's
    "qwen3moe": (
        {"model_type": "qwen3_moe", "decoder_sparse_step": 1, "mlp_only_layers": []},
        {
            "ffn_gate_inp": "mlp.gate",
            "ffn_gate_exps": "mlp.switch_mlp.gate_proj",
            "ffn_up_exps": "mlp.switch_mlp.up_proj",
            "ffn_down_exps": "mlp.switch_mlp.down_proj",
        },
    ),
    "phi3": (
        {"model_type": "phi3"},
        {"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"},
    ),
}
TOP = {**NAMES, "output": "lm_head"}


def measure(name: str, folder: Path) -> str:
    config_extra, names = EXTRA[name]
    names = {**LAYER, **names}
    config = {**oraclekit.ARCHS[name].config, **config_extra}
    weights = {}
    for key, value in mx.load(str(oraclekit.rebuilt(name, folder))).items():
        parts = key.split(".")
        if parts[0] != "blk":
            weights[f"{TOP[parts[0]]}.weight"] = value
            continue
        module = f"model.layers.{parts[1]}.{names[parts[2]]}"
        weights[module if parts[2] == "attn_sinks" else f"{module}.{parts[3]}"] = value
    model_class, args_class = _get_classes(config)
    model = model_class(args_class.from_dict(config))
    model.load_weights(list(weights.items()), strict=True)
    recorded, ours, equal = oraclekit.fixture(name), [], True
    for answer in recorded["prompts"]:
        cache, fed, steps = make_prompt_cache(model), answer["prompt"], []
        for theirs in answer["steps"]:
            logits = model(mx.array([fed]), cache=cache)[0, -1].astype(mx.float32)
            chosen = int(mx.argmax(logits).item())
            steps.append(oraclekit.Step(chosen, np.array(logits)))
            equal &= chosen == theirs["id"]
            fed = [chosen]
        ours.append(steps)
    return f"{name}: ids equal {equal}, max |logit diff| {max_logit_difference(recorded, ours):.1e}"


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as scratch:
        for arch in sys.argv[1:] or list(EXTRA):
            print(measure(arch, Path(scratch)))
