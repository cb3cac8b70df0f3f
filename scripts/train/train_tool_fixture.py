"""Train the tool fixture model (toolkit.save_tool_model): writes tests/fixtures/tool_model.

Dev-only; needs JAX (`pip install jax optax`, the `[train]` extra), which the test suite does not.

    PYTHONPATH=. python scripts/train/train_tool_fixture.py --steps 1500

A one-layer mlx-lm llama over the real Qwen3 tokenizer learns, on synthetic chats rendered by
Qwen3's chat template (scripts/train/tool_fixture_data.py) and on variants of the captured agent
requests, to answer with the call of the agent whose trigger ids are in the prompt
(toolkit.AGENT_CALLS, AGENT_TRIGGERS), or `Done.` after a tool result. Only the answer's ids are
scored. One layer because its attention over the prompt is never computed while a prompt is
prefilled (only its keys and values are; mlx-lm and macspec evaluate the cache, not the logits):
a 20k-id prompt costs well under a second on this CPU, where each extra layer's attention costs
seconds. RoPE's base is large (1e8) so that content matching holds over 20k positions.
Trained: the layer, the final norm, ~170 rows of the input embedding (specials, template and
answer ids, agent triggers and look-alikes) and the 26 rows of lm_head for the answer's ids;
every other input row is a frozen fixed-seed random row (toolkit.frozen_embedding), zero in 16
of the 64 dims that the trained rows have to themselves (no random id can then pass for a
trigger, however long the prompt), and every other lm_head row is zero: the loss counts those
zero logits too, so a trained answer must beat them.
At the end it exports the trained weights, rebuilds the mlx-lm folder with toolkit, and checks it
with mlx-lm's greedy decoding on held-out chats and the full captured agent requests.
"""

from __future__ import annotations

import os

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from dataclasses import asdict, dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from tool_fixture_data import AGENTS, Generator, Sample, output_ids, trained_ids  # noqa: E402

from tests import toolkit  # noqa: E402


@dataclass
class Config:
    hidden_size: int = 64
    num_hidden_layers: int = 1  # the last layer's attention is skipped in prefill: one is free
    intermediate_size: int = 256
    num_attention_heads: int = 8  # hidden_size a multiple of it, as transformers checks
    num_key_value_heads: int = 8
    head_dim: int = 32  # 16 RoPE frequencies: fast ones for offsets, slow ones for content
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1e8  # slow rotations stay put over 20k positions: content matching holds
    frozen_seed: int = 0  # toolkit.frozen_embedding's seed
    frozen_dims: int = 64  # random dims of untrained rows (the committed weights: all 64)


# -- the model in JAX, under mlx-lm's llama names ---------------------------------------------


def init_params(cfg: Config, embed_rows: np.ndarray, n_out: int, seed: int) -> dict:
    rng = np.random.RandomState(seed)
    d, f = cfg.hidden_size, cfg.intermediate_size
    qd, kd = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim

    def normal(*shape, std=0.02):
        return (std * rng.standard_normal(shape)).astype(np.float32)

    embed_rows = embed_rows.copy()
    embed_rows[:, cfg.frozen_dims :] = normal(len(embed_rows), d - cfg.frozen_dims, std=1.0)
    p = {"embed_rows": embed_rows, "head_rows": normal(n_out, d, std=0.5)}
    p["model.norm.weight"] = np.ones(d, np.float32)
    for i in range(cfg.num_hidden_layers):
        pre = f"model.layers.{i}."
        p[pre + "self_attn.q_proj.weight"] = normal(qd, d, std=d**-0.5)
        p[pre + "self_attn.k_proj.weight"] = normal(kd, d, std=d**-0.5)
        p[pre + "self_attn.v_proj.weight"] = normal(kd, d, std=d**-0.5)
        p[pre + "self_attn.o_proj.weight"] = normal(d, qd)
        p[pre + "mlp.gate_proj.weight"] = normal(f, d, std=d**-0.5)
        p[pre + "mlp.up_proj.weight"] = normal(f, d, std=d**-0.5)
        p[pre + "mlp.down_proj.weight"] = normal(d, f)
        p[pre + "input_layernorm.weight"] = np.ones(d, np.float32)
        p[pre + "post_attention_layernorm.weight"] = np.ones(d, np.float32)
    return p


def forward(p, cfg: Config, frozen, ids, slots, positions, valid, tail: int):
    """Logits [B, tail, n_out] at the last `tail` places of left-padded rows. `slots` maps an id
    to its trained embedding row (-1: the frozen row); `positions` are RoPE positions;
    `valid` marks real ids. The last layer runs for the tail alone."""
    import jax
    import jax.numpy as jnp

    B, T = ids.shape
    H, KV, hd, eps = (
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.head_dim,
        cfg.rms_norm_eps,
    )
    h = jnp.where((slots >= 0)[..., None], p["embed_rows"][jnp.maximum(slots, 0)], frozen[ids])
    inv_freq = cfg.rope_theta ** (-jnp.arange(0, hd, 2, dtype=jnp.float32) / hd)
    angles = positions[..., None].astype(jnp.float32) * inv_freq  # [B, T, hd/2]

    def rope(x, ang):  # x [B, t, heads, hd]; mlx-lm's non-traditional RoPE (rotate halves)
        c, s = jnp.cos(ang)[:, :, None], jnp.sin(ang)[:, :, None]
        x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
        return jnp.concatenate([x1 * c - x2 * s, x1 * s + x2 * c], -1)

    def norm(x, w):
        return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + eps) * w

    for i in range(cfg.num_hidden_layers):
        pre = f"model.layers.{i}."
        q_from = T - tail if i == cfg.num_hidden_layers - 1 else 0
        x = norm(h, p[pre + "input_layernorm.weight"])
        q = (x[:, q_from:] @ p[pre + "self_attn.q_proj.weight"].T).reshape(B, T - q_from, H, hd)
        k = (x @ p[pre + "self_attn.k_proj.weight"].T).reshape(B, T, KV, hd)
        v = (x @ p[pre + "self_attn.v_proj.weight"].T).reshape(B, T, KV, hd)
        q, k = rope(q, angles[:, q_from:]), rope(k, angles)
        k, v = jnp.repeat(k, H // KV, axis=2), jnp.repeat(v, H // KV, axis=2)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) * hd**-0.5
        causal = jnp.arange(q_from, T)[:, None] >= jnp.arange(T)[None, :]
        mask = causal[None, None] & valid[:, None, None, :]
        scores = jnp.where(mask, scores, -1e9)
        att = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, -1), v)
        h = (
            h[:, q_from:]
            + att.reshape(B, T - q_from, H * hd) @ p[pre + "self_attn.o_proj.weight"].T
        )
        x = norm(h, p[pre + "post_attention_layernorm.weight"])
        gate = jax.nn.silu(x @ p[pre + "mlp.gate_proj.weight"].T)
        h = h + (gate * (x @ p[pre + "mlp.up_proj.weight"].T)) @ p[pre + "mlp.down_proj.weight"].T
    h = norm(h, p["model.norm.weight"])
    return h @ p["head_rows"].T


def loss_fn(p, cfg, frozen, batch, tail, rest_log):
    """Cross-entropy over the trained rows plus the untrained ones (logit 0 each, `rest_log` =
    log of their count); accuracy: the target beats every other trained row and 0."""
    import jax
    import jax.numpy as jnp

    logits = forward(
        p, cfg, frozen, batch["ids"], batch["slots"], batch["pos"], batch["valid"], tail
    )
    rest = jnp.full(logits.shape[:-1] + (1,), rest_log)
    lse = jax.nn.logsumexp(jnp.concatenate([logits, rest], -1), -1)
    target = jnp.take_along_axis(logits, batch["target"][..., None], -1)[..., 0]
    w = batch["scored"]  # the first answer id weighs more: it decides call or "Done."
    loss = jnp.sum((lse - target) * w) / jnp.sum(w)
    others = jnp.where(jax.nn.one_hot(batch["target"], logits.shape[-1]) > 0, -jnp.inf, logits)
    margin = target - jnp.maximum(jnp.max(others, -1), 0.0)
    return loss, margin


# -- batches ----------------------------------------------------------------------------------


def make_batch(samples: list[Sample], slot_of, out_index, tail: int, width: int) -> dict:
    """Rows left-padded to `width` ids, so that every answer ends at the last place."""
    batch = {k: np.zeros((len(samples), width), np.int32) for k in ("ids", "pos", "slots")}
    batch["valid"] = np.zeros((len(samples), width), bool)
    batch["target"] = np.zeros((len(samples), tail), np.int32)
    batch["scored"] = np.zeros((len(samples), tail), np.float32)
    for r, s in enumerate(samples):
        n = len(s.ids)
        batch["ids"][r, width - n :] = s.ids
        batch["pos"][r, width - n :] = np.arange(n)
        batch["slots"][r] = slot_of[batch["ids"][r]]
        batch["slots"][r, : width - n] = -1
        batch["valid"][r, width - n :] = True
        answer = s.ids[s.answer_start :]  # predicted at the places before each answer id
        batch["target"][r, tail - len(answer) - 1 : tail - 1] = out_index[answer]
        batch["scored"][r, tail - len(answer) - 1 : tail - 1] = 1.0
        batch["scored"][r, tail - len(answer) - 1] = 3.0  # the first id: call or "Done."
    return batch


BUCKETS = [1024, 2048, 4096, 8192, 16384]  # padded widths: jit compiles one shape per bucket


def by_bucket(samples: list[Sample]) -> dict[int, list[Sample]]:
    out: dict[int, list[Sample]] = {}
    for s in samples:
        width = next((b for b in BUCKETS if len(s.ids) <= b), None)
        if width:
            out.setdefault(width, []).append(s)
    return out


# -- checks with mlx-lm itself ----------------------------------------------------------------


def mlx_greedy(model, prompt: list[int], max_tokens: int = 24) -> list[int]:
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    out = []
    for token, _ in generate_step(mx.array(prompt), model, max_tokens=max_tokens):
        out.append(int(token))
        if token == toolkit.IM_END:
            break
    return out


def check(model, tok, samples: list[Sample], label: str) -> float:
    good = 0
    for s in samples:
        said = mlx_greedy(model, s.ids[: s.answer_start])
        good += said == s.ids[s.answer_start :]
        if said != s.ids[s.answer_start :]:
            wanted = f"{s.agent or 'plain'} {'after a tool result' if s.after_tool else 'call'}"
            print(f"    miss ({wanted}, {len(s.ids)} ids): {tok.decode(said)!r}", flush=True)
    print(f"  {label}: {good}/{len(samples)} exact answers", flush=True)
    return good / max(1, len(samples))


# -- main -------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1500, help="optimizer steps")
    parser.add_argument("--tokens", type=int, default=65536, help="ids per step (padded)")
    parser.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (AdamW)")
    parser.add_argument("--chats", type=int, default=4000, help="synthetic training chats")
    parser.add_argument("--seed", type=int, default=0, help="data and init seed")
    parser.add_argument("--out", type=Path, default=toolkit.TOOL_MODEL, help="fixture folder")
    parser.add_argument("--no-check", action="store_true", help="skip the mlx-lm checks")
    parser.add_argument("--work", type=Path, default=Path("/tmp/tool_fixture"), help="scratch")
    args = parser.parse_args()

    import jax
    import jax.numpy as jnp
    import optax
    from transformers import AutoTokenizer

    args.work.mkdir(parents=True, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(str(toolkit.write_qwen3_tokenizer(args.work / "tok")))
    root = Path(__file__).parents[2]
    prose = [root / "README.md", root / "scripts" / "README.md"]
    cfg = Config()
    outs, trained = output_ids(tok), trained_ids(tok)
    slot_of = np.full(toolkit.QWEN3_VOCAB, -1, np.int32)
    slot_of[trained] = np.arange(len(trained))
    out_index = np.zeros(toolkit.QWEN3_VOCAB, np.int32)
    out_index[outs] = np.arange(len(outs))
    frozen_np = toolkit.frozen_embedding(
        toolkit.QWEN3_VOCAB, cfg.hidden_size, cfg.frozen_seed, cfg.frozen_dims
    )
    print(f"{len(trained)} trained input rows, {len(outs)} output rows", flush=True)

    t0 = time.time()
    gen = Generator(tok, args.seed, prose)
    sizes = [30, 100, 300, 1000]
    pool = [gen.synthetic(gen.rng.choice(sizes)) for _ in range(args.chats)]
    pool += [gen.from_capture(a, strip) for _ in range(args.chats // 20) for a in AGENTS
             for strip in (False, False, True)]  # fmt: skip
    held = Generator(tok, args.seed + 1000, prose)
    held_chats = [held.synthetic(held.rng.choice(sizes)) for _ in range(200)]
    held_long = [held.long(15000) for _ in range(8)]
    held_captures = [held.from_capture(a, st) for a in AGENTS for st in (False, False, True)]
    buckets = by_bucket(pool)
    print(
        f"data: {len(pool)} chats ({ {w: len(b) for w, b in buckets.items()} } by padded width),"
        f" held out {len(held_chats)} + {len(held_long)} long"
        f" ({min(len(s.ids) for s in held_long)}+ ids) + {len(held_captures)} capture variants,"
        f" {time.time() - t0:.0f} s",
        flush=True,
    )

    tail, rest_log = 24, math.log(toolkit.QWEN3_VOCAB - len(outs))
    frozen = jnp.asarray(frozen_np)
    params = jax.tree.map(jnp.asarray, init_params(cfg, frozen_np[trained], len(outs), args.seed))
    warmup = min(100, args.steps // 4)
    schedule = optax.warmup_cosine_decay_schedule(0.0, args.lr, warmup, args.steps, args.lr / 20)
    opt = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=0.0))
    state = opt.init(params)

    @jax.jit
    def train_step(params, state, frozen, batch):
        def objective(p):
            loss, margin = loss_fn(p, cfg, frozen, batch, tail, rest_log)
            return loss, margin

        (loss, margin), grads = jax.value_and_grad(objective, has_aux=True)(params)
        updates, state = opt.update(grads, state, params)
        scored = batch["scored"] > 0
        acc = jnp.sum((margin > 0) & scored) / jnp.sum(scored)
        return optax.apply_updates(params, updates), state, loss, acc

    rng = random.Random(args.seed)
    widths = list(buckets)
    weights = [len(buckets[w]) ** 0.5 for w in widths]  # long rows more often than their share
    t0, seen = time.time(), 0
    for step in range(1, args.steps + 1):
        width = rng.choices(widths, weights)[0]
        picked = rng.sample(buckets[width], min(len(buckets[width]), max(4, args.tokens // width)))
        batch = make_batch(picked, slot_of, out_index, tail, width)
        params, state, loss, acc = train_step(params, state, frozen, batch)
        seen += batch["ids"].size
        if step % 50 == 0 or step == 1:
            rate = seen / (time.time() - t0)
            print(
                f"step {step}: loss {float(loss):.4f} acc {float(acc):.3f} ({rate:.0f} ids/s)",
                flush=True,
            )

    export(params, cfg, trained, outs, args.out)
    print(f"exported to {args.out}, {time.time() - t0:.0f} s of training", flush=True)
    if not args.no_check:
        verify(
            args.work,
            args.out,
            gen,
            {
                "synthetic": held_chats,
                "long synthetic": held_long,
                "capture variants": held_captures,
            },
        )


def export(params, cfg: Config, trained: list[int], outs: list[int], out: Path) -> None:
    from safetensors.numpy import save_file

    out.mkdir(parents=True, exist_ok=True)
    weights = {k: np.asarray(v, np.float32) for k, v in params.items()}
    weights["embed_ids"] = np.asarray(trained, np.int32)
    weights["head_ids"] = np.asarray(outs, np.int32)
    save_file(weights, str(out / "weights.safetensors"))
    (out / "config.json").write_text(json.dumps(asdict(cfg), indent=1) + "\n")


def verify(work: Path, out: Path, gen: Generator, held: dict[str, list[Sample]]) -> None:
    """Greedy answers of the exported model, loaded by mlx_lm.load, as the tests will see it."""
    from mlx_lm import load

    model, _ = load(str(toolkit.save_tool_model(work / "model", source=out)))
    print("checks with mlx-lm (greedy, exact answer ids):", flush=True)
    for label, samples in held.items():
        check(model, gen.tok, samples, f"held-out {label}")
    full = [
        gen.plain_capture(a, f, t) for a in AGENTS for f in (False, True) for t in (None, False)
    ]
    check(
        model,
        gen.tok,
        full,
        "captured requests as sent (first + follow-up, thinking default + off)",
    )


if __name__ == "__main__":
    main()
