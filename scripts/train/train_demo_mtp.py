"""Train an MTP head for the shipped demo target, on the target's own answers; ship it.

Dev-only (`pip install -e '.[train]'`); nothing here is imported at run time.

    python scripts/train/train_demo_mtp.py --ship macspec/demo/mtp

1. prompts   the demo corpus's training prompts (never the held-out ones).
2. answers   the 4-bit demo target's greedy answers to them, with macspec's engine.
3. states    the target's final post-norm hidden states over prompt + answer (what the head reads
             at run time) and its own next-token choices (what the head learns to predict).
4. train     with JAX + optax on one core: pair (x_{i+1}, h_i) -> the target's choice at i + 1,
             cross-entropy; the head's layer starts from the target's last layer.
5. export    macspec's MTP format (`model_type: "mtp"`, the target's config as text_config),
             4-bit like the demo pair; then acceptance and tokens per target pass on the
             held-out prompts, next to the demo draft model's.
"""

from __future__ import annotations

import os

os.environ.setdefault(
    "XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
)
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
from demo_corpus import build_corpus  # noqa: E402
from demo_export import ModelConfig  # noqa: E402
from demo_jax import blocks, rms_norm  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "macspec" / "demo"


def target_answers(prompts: list[str], max_tokens: int, log) -> list[list[int]]:
    """prompt + greedy answer + EOS ids for each prompt, by the 4-bit demo target."""
    from mlx_lm import load

    from macspec.engine.generate.loop import Engine, GenerationConfig
    from macspec.models.templates import encode_prompt

    model, tok = load(str(DEMO / "target"))
    engine = Engine(model, tok)
    eos = next(iter(tok.eos_token_ids))
    sequences, started = [], time.time()
    for i, text in enumerate(prompts):
        ids = encode_prompt(tok, text)
        done = list(engine.generate(ids, GenerationConfig(max_tokens=max_tokens)))[-1]
        sequences.append(ids + done.tokens + [eos])
        if (i + 1) % 100 == 0:
            log(f"  answers: {i + 1}/{len(prompts)} ({time.time() - started:.0f}s)")
    return sequences


def target_states(sequences: list[list[int]], seq_len: int):
    """Padded arrays: ids, post-norm hidden states, the target's next-token choices, lengths."""
    import mlx.core as mx
    from mlx_lm import load

    model, _ = load(str(DEMO / "target"))
    n, dim = len(sequences), model.args.hidden_size
    ids = np.zeros((n, seq_len), np.int32)
    hidden = np.zeros((n, seq_len, dim), np.float32)
    choice = np.zeros((n, seq_len), np.int32)
    lengths = np.zeros((n,), np.int32)
    for row, seq in enumerate(sequences):
        seq = seq[:seq_len]
        h = model.model(mx.array(seq)[None])  # the final norm's output, as the taps see it
        logits = model.model.embed_tokens.as_linear(h)
        ids[row, : len(seq)] = seq
        hidden[row, : len(seq)] = np.array(h[0].astype(mx.float32))
        choice[row, : len(seq)] = np.array(mx.argmax(logits[0], axis=-1))
        lengths[row] = len(seq)
    return ids, hidden, choice, lengths


def dequantized(path: Path) -> dict[str, np.ndarray]:
    import mlx.core as mx
    import mlx.nn as nn
    from mlx.utils import tree_flatten
    from mlx_lm import load

    model, _ = load(str(path))
    weights = {}
    for name, module in model.named_modules():
        if isinstance(module, (nn.QuantizedLinear, nn.QuantizedEmbedding)):
            w = mx.dequantize(
                module.weight, module.scales, module.biases, module.group_size, module.bits
            )
            weights[f"{name}.weight"] = np.array(w.astype(mx.float32))
    for name, value in tree_flatten(model.parameters()):
        if value.ndim == 1 and not name.endswith(("scales", "biases")):
            weights[name] = np.array(value.astype(mx.float32))
    return weights


def init_head(target: dict[str, np.ndarray], cfg: ModelConfig, rng) -> dict[str, np.ndarray]:
    """fc passes the embedding half through; the layer is the target's last; norms its own."""
    d = cfg.hidden_size
    last = f"model.layers.{cfg.num_hidden_layers - 1}."
    head = {
        "fc.weight": np.concatenate([np.eye(d), 0.02 * rng.standard_normal((d, d))], 1),
        "pre_fc_norm_embedding.weight": np.ones(d),
        "pre_fc_norm_hidden.weight": np.ones(d),
        "norm.weight": target["model.norm.weight"],
    }
    for key, value in target.items():
        if key.startswith(last):
            head["layers.0." + key[len(last) :]] = value
    return {k: np.asarray(v, np.float32) for k, v in head.items()}


def train(head, embed, cfg, data, steps: int, batch: int, lr: float, seed: int, log):
    import jax
    import jax.numpy as jnp
    import optax

    ids, hidden, choice, lengths = data
    embed = jnp.asarray(embed)
    eps = cfg.rms_norm_eps

    def loss_fn(p, x_ids, h, labels, valid):
        e = embed[x_ids]
        x = (
            jnp.concatenate(
                [
                    rms_norm(e, p["pre_fc_norm_embedding.weight"], eps),
                    rms_norm(h, p["pre_fc_norm_hidden.weight"], eps),
                ],
                -1,
            )
            @ p["fc.weight"].T
        )
        segments = jnp.ones(x_ids.shape, jnp.int32)
        x = blocks(p, cfg, x, segments, "layers.", 1)
        logits = rms_norm(x, p["norm.weight"], eps) @ embed.T
        logp = jax.nn.log_softmax(logits, -1)
        nll = -jnp.take_along_axis(logp, labels[..., None], -1)[..., 0]
        correct = (jnp.argmax(logits, -1) == labels) * valid
        return (nll * valid).sum() / valid.sum(), correct.sum() / valid.sum()

    warmup = min(50, steps // 2)
    schedule = optax.warmup_cosine_decay_schedule(0.0, lr, warmup, steps, lr * 0.1)
    optimizer = optax.adamw(schedule, weight_decay=0.0)
    params = {k: jnp.asarray(v) for k, v in head.items()}
    state = optimizer.init(params)

    @jax.jit
    def step(params, state, x_ids, h, labels, valid):
        (loss, acc), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            params, x_ids, h, labels, valid
        )
        updates, state = optimizer.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss, acc

    rng = np.random.default_rng(seed)
    positions = np.arange(ids.shape[1] - 1)
    started = time.time()
    for i in range(steps):
        rows = rng.choice(len(ids), batch, replace=False)
        # pair i: (x_{i+1}, h_i) -> the target's choice after x_{i+1}
        x_ids, h = ids[rows, 1:], hidden[rows, :-1]
        labels = choice[rows, 1:]
        valid = (positions[None] + 1 < lengths[rows, None]).astype(np.float32)
        params, state, loss, acc = step(params, state, x_ids, h, labels, valid)
        if (i + 1) % 100 == 0 or i == 0:
            seconds = time.time() - started
            log(f"  step {i + 1}/{steps}: loss {float(loss):.3f}, agreement {float(acc):.3f}")
            log(f"    {seconds:.0f}s")
    return {k: np.asarray(v) for k, v in params.items()}


def export(head: dict[str, np.ndarray], out: Path) -> None:
    import mlx.core as mx
    import mlx.nn as nn
    from mlx.utils import tree_flatten

    from macspec.engine.drafters.mtp import MTPHead

    config = json.loads((DEMO / "target" / "config.json").read_text())
    text = {k: v for k, v in config.items() if k not in ("quantization", "quantization_config")}
    module = MTPHead(text)
    module.load_weights([(k, mx.array(v)) for k, v in head.items()])
    nn.quantize(module, group_size=64, bits=4)  # as the demo pair; scales stay float32
    mx.eval(module.parameters())
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    head_config = {
        "model_type": "mtp",
        "text_config": text,
        "block_size": 3,
        "quantization": {"group_size": 64, "bits": 4, "mode": "affine"},
    }
    (partial / "config.json").write_text(json.dumps(head_config, indent=2) + "\n")
    mx.save_safetensors(
        str(partial / "model.safetensors"),
        dict(tree_flatten(module.parameters())),
        {"format": "mlx"},
    )
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ship", type=Path, default=DEMO / "mtp", help="where to write the head")
    parser.add_argument("--prompts", type=int, default=800, help="training prompts answered")
    parser.add_argument("--max-tokens", type=int, default=192)
    parser.add_argument("--seq-len", type=int, default=320)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--data", type=Path, default=ROOT / "scratch" / "demo_mtp_data.npz",
        help="steps 1-3 are saved here and reused by the next run",
    )  # fmt: skip
    args = parser.parse_args(argv)

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    if args.data.is_file():
        saved = np.load(args.data)
        data = tuple(saved[k] for k in ("ids", "hidden", "choice", "lengths"))
        log(f"1-3. reusing {args.data} ({int(data[3].sum())} tokens)")
    else:
        train_pairs, _ = build_corpus(args.seed, 1500, holdout=0.05)  # held-out never used
        random.Random(args.seed).shuffle(train_pairs)
        prompts = [p["prompt"] for p in train_pairs[: args.prompts]]
        log(f"1-2. the target answers {len(prompts)} training prompts")
        sequences = target_answers(prompts, args.max_tokens, log)
        log(f"3. hidden states and choices over {sum(map(len, sequences))} tokens")
        data = target_states(sequences, args.seq_len)
        args.data.parent.mkdir(parents=True, exist_ok=True)
        np.savez(args.data, ids=data[0], hidden=data[1], choice=data[2], lengths=data[3])
    target = dequantized(DEMO / "target")
    cfg_json = json.loads((DEMO / "target" / "config.json").read_text())
    cfg = ModelConfig(
        hidden_size=cfg_json["hidden_size"],
        num_hidden_layers=cfg_json["num_hidden_layers"],
        intermediate_size=cfg_json["intermediate_size"],
        num_attention_heads=cfg_json["num_attention_heads"],
        num_key_value_heads=cfg_json["num_key_value_heads"],
        vocab_size=cfg_json["vocab_size"],
    )
    head = init_head(target, cfg, np.random.default_rng(args.seed))
    log(f"4. training the head: {sum(v.size for v in head.values())} parameters")
    head = train(
        head, target["model.embed_tokens.weight"], cfg, data, args.steps, args.batch_size, args.lr,
        args.seed, log,
    )  # fmt: skip
    export(head, args.ship)
    log(f"5. wrote {args.ship}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
