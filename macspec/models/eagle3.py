"""EAGLE-3 heads read from their published folders: Red Hat's speculators format and the EAGLE /
SpecForge format (yuhuili's, SGLang's, NVIDIA's). Heads ship no tokenizer: the target's is used.

Both formats name three target layers to tap, by two conventions:

- speculators (and vLLM, mlx-vlm): hidden-state indices, id i is the output of decoder layer
  i - 1 (id 0 would be the embedding); the default is [2, L // 2, L - 3];
- EAGLE / SpecForge (and SGLang): 0-based decoder-layer outputs; with no ids the EAGLE default,
  hidden states [2, L // 2, L - 3], which is layers [1, L // 2 - 1, L - 4].

Both become 0-based layers here. Every check the config and the weights' headers can answer
(format, hidden size, tapped layers, vocabularies, d2t's length) runs before a weight is read.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx_lm.models.llama import ModelArgs as LayerArgs

from macspec.errors import MacspecError
from macspec.models.heads import load_into, quantize_like, read_config, read_weights, text_config
from macspec.models.loader import safetensors_problem

EAGLE3_TARGETS = ("llama", "qwen2", "qwen3", "qwen3_moe", "gpt_oss", "qwen3_5", "qwen3_5_moe")
"""Target architectures whose decoder layers macspec taps for an EAGLE-3 head (mlx-lm's classes,
the residual stream after each layer, as transformers' hidden_states). The hybrid Qwen3.5/3.6
ones have community heads (speculators format); their recurrent layers roll back as ever."""
SPECULATORS = "speculators"
EAGLE = "EAGLE"


def eagle3_format(config: dict[str, Any]) -> str | None:
    """'speculators', 'EAGLE', or None when the config is neither; both at once is refused."""
    speculators = "speculators_model_type" in config or "speculators_config" in config
    architectures = config.get("architectures") or []
    eagle = "eagle_config" in config or any(
        str(a).endswith("ForCausalLMEagle3") for a in architectures
    )
    if speculators and eagle:
        raise MacspecError(
            "an EAGLE-3 config with both speculators fields and EAGLE ones (eagle_config or an "
            "*ForCausalLMEagle3 architecture): its tap ids cannot be read unambiguously"
        )
    return SPECULATORS if speculators else EAGLE if eagle else None


def _tensor_shapes(folder: Path) -> dict[str, list[int]]:
    """Every tensor's shape from the safetensors headers, reading no weights."""
    shapes: dict[str, list[int]] = {}
    for file in sorted(folder.glob("*.safetensors")):
        problem = safetensors_problem(file)
        if problem is not None:
            raise MacspecError(f"{file}: {problem}; download it again")
        with open(file, "rb") as handle:
            size = int.from_bytes(handle.read(8), "little")
            header = json.loads(handle.read(size))
        shapes.update({k: v["shape"] for k, v in header.items() if k != "__metadata__"})
    if not shapes:
        raise MacspecError(f"{folder}: no *.safetensors weights")
    return {k.removeprefix("model."): v for k, v in shapes.items()}


def _taps(folder: Path, config: dict[str, Any], form: str, depth: int) -> tuple[int, ...]:
    """The 0-based target layers a head reads, by its format's convention."""
    if form == SPECULATORS:
        ids = config.get("eagle_aux_hidden_state_layer_ids")
        if ids and 0 in ids:
            raise MacspecError(
                f"{folder} taps hidden state 0 (the target's embedding output), which macspec "
                "does not tap"
            )
        ids = ids or [2, depth // 2, depth - 3]
        layers, named = [int(i) - 1 for i in ids], f"hidden states {list(ids)} (speculators ids)"
    else:
        eagle = config.get("eagle_config") or {}
        if eagle.get("use_aux_hidden_state") is False:
            raise MacspecError(
                f"{folder}: an EAGLE head with no auxiliary hidden states (EAGLE-1/2)"
            )
        ids = eagle.get("eagle_aux_hidden_state_layer_ids")
        layers = [int(i) for i in ids] if ids else [1, depth // 2 - 1, depth - 4]
        named = f"layers {layers} (EAGLE ids: 0-based layer outputs)"
    if any(not 0 <= i < depth for i in layers):
        raise MacspecError(
            f"{folder} taps target {named}, but the target has {depth} decoder layers "
            f"(0 to {depth - 1})"
        )
    return tuple(layers)


def check_eagle3(folder: Path, config: dict[str, Any], target_config: dict[str, Any]):
    """The head's Eagle3Config, after every check its config and weight headers can answer."""
    from macspec.engine.drafters.eagle3 import Eagle3Config

    form = eagle3_format(config)
    if form == SPECULATORS and config.get("speculators_model_type", "eagle3") != "eagle3":
        raise MacspecError(
            f"{folder} is a speculators '{config.get('speculators_model_type')}' head; macspec "
            "reads EAGLE-3 heads (speculators_model_type eagle3)"
        )
    layer = config.get("transformer_layer_config") or {} if form == SPECULATORS else config
    fields = {field.name for field in dataclasses.fields(LayerArgs)}
    layer = {key: value for key, value in layer.items() if key in fields}  # the layer's own
    target = text_config(target_config)
    kind = str(target.get("model_type", target_config.get("model_type", "?")))
    if kind not in EAGLE3_TARGETS:
        raise MacspecError(
            f"{folder} is an EAGLE-3 head; macspec taps {', '.join(EAGLE3_TARGETS)} targets, "
            f"and this target is {kind}"
        )
    if layer.get("model_type", "llama") != "llama":
        raise MacspecError(
            f"{folder}: EAGLE-3 heads with {layer.get('model_type')} decoder layers are not "
            "supported (llama layers only)"
        )
    required = ("hidden_size", "vocab_size", "intermediate_size", "num_attention_heads")
    missing = [key for key in required if not isinstance(layer.get(key), int)]
    if missing:
        raise MacspecError(f"{folder}: not an EAGLE-3 config (no {', '.join(missing)})")
    hidden, vocab = layer["hidden_size"], layer["vocab_size"]
    target_hidden = int(config.get("target_hidden_size") or hidden)
    if target_hidden != target.get("hidden_size"):
        raise MacspecError(
            f"{folder} is an EAGLE-3 head for hidden size {target_hidden}; the target's is "
            f"{target.get('hidden_size')}"
        )
    if vocab != target.get("vocab_size"):
        raise MacspecError(
            f"{folder} is an EAGLE-3 head for a {vocab}-token vocabulary; the target's has "
            f"{target.get('vocab_size')}"
        )
    layers = _taps(folder, config, form, int(target.get("num_hidden_layers", 0)))
    draft_vocab = int(config.get("draft_vocab_size") or vocab)
    shapes = _tensor_shapes(folder)
    if draft_vocab != vocab:
        if "d2t" not in shapes:
            raise MacspecError(
                f"{folder}: no d2t to map its {draft_vocab}-token draft vocabulary to the target's"
            )
        if shapes["d2t"] != [draft_vocab]:
            raise MacspecError(
                f"{folder}: d2t has shape {shapes['d2t']}; the draft vocabulary has "
                f"{draft_vocab} ids"
            )
    shipped = shapes.get("embed_tokens.weight")
    own = shipped is not None and (
        bool(config.get("embed_requires_grad")) or shipped[0] != vocab or hidden != target_hidden
    )
    if shipped is None and hidden != target_hidden:
        raise MacspecError(
            f"{folder}: a head of width {hidden} for a {target_hidden}-wide target needs its own "
            "embed_tokens, and it ships none"
        )
    tied = "lm_head.weight" not in shapes and draft_vocab == vocab
    return Eagle3Config(
        layer={"rms_norm_eps": 1e-6, "num_hidden_layers": 1, **layer},
        target_layers=layers,
        target_hidden_size=target_hidden,
        draft_vocab_size=draft_vocab,
        norm_before_residual=bool(
            config.get("norm_before_residual", form == SPECULATORS)  # vLLM's defaults
        ),
        norm_before_fc=bool(config.get("norm_before_fc", False)),
        own_embedding=own,
        tied_head=tied,
    )


def _head_weights(weights: dict[str, mx.array], parsed) -> dict[str, mx.array]:
    """Published names -> the head's: EAGLE's `midlayer.` is layer 0; what the head does not
    use (t2d, the verifier's copies, the embedding it borrows from the target) is dropped."""
    out = {}
    for key, value in weights.items():
        key = key.removeprefix("model.").replace("midlayer.", "layers.0.")
        if key == "t2d" or key.startswith("verifier_") or "rotary_emb" in key:
            continue
        if key.startswith("embed_tokens.") and not parsed.own_embedding:
            continue
        if key == "d2t":
            if not parsed.maps_vocabulary:
                continue
            value = value.astype(mx.int32)
        if key.startswith("lm_head.") and parsed.tied_head:
            continue
        out[key] = value
    return out


def load_eagle3(folder: Path, target_config: dict[str, Any]):
    """An EAGLE-3 head from its folder (checked as `check_eagle3` does, then loaded)."""
    from macspec.engine.drafters.eagle3 import Eagle3Head

    config = read_config(folder)
    parsed = check_eagle3(folder, config, target_config)
    weights = _head_weights(read_weights(folder), parsed)
    head = Eagle3Head(parsed)
    quantize_like(head, config, weights)
    load_into(head, weights, folder)
    if parsed.maps_vocabulary:
        targets = mx.arange(parsed.draft_vocab_size) + head.d2t
        low, high = int(targets.min().item()), int(targets.max().item())
        if low < 0 or high >= parsed.layer["vocab_size"]:
            raise MacspecError(
                f"{folder}: d2t maps draft ids to {low}..{high}, outside the target's "
                f"{parsed.layer['vocab_size']}-token vocabulary"
            )
    return head
