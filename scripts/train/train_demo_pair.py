"""Train the shipped demo pair: a small Llama target and a distilled draft, one shared tokenizer.

Dev-only (`pip install -e '.[train]'`); nothing here is imported at run time.

    python scripts/train/train_demo_pair.py --out scratch/demo --ship macspec/demo

Steps (each a function; `main()` alone does IO):
  1. corpus     instruction pairs from the interpreter's own standard library:
                user = "Write a Python function `f(args)`: <first docstring paragraph>",
                assistant = the function's source. Sorted files, seeded shuffle, 5% held out.
  2. tokenizer  byte-level BPE (tokenizers), chat special tokens, a Jinja chat template.
  3. target     Llama (mlx-lm `llama` layout) trained with JAX + optax on ONE CPU core.
  4. draft      a ~5x smaller Llama distilled from the target (KL to its logits + next-token CE).
  5. export     Hugging Face layout (config.json, model.safetensors, tokenizer files), checked by
                loading it with `mlx_lm.load` and comparing logits with the JAX model.
  6. quantize   4-bit with `mlx_lm.convert`; held-out perplexity before/after, greedy draft/target
                agreement (an estimate of speculative acceptance), one example generation.
"""

from __future__ import annotations

import os

# One core for training: the machine is shared. Must be set before jax is imported.
os.environ.setdefault(
    "XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
)
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("RAYON_NUM_THREADS", "1")  # the BPE trainer
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if hasattr(os, "sched_setaffinity"):  # Linux: pin this thread and all it starts to one core
    os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from dataclasses import asdict, dataclass, replace  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
from demo_corpus import (  # noqa: E402
    CHAT_TEMPLATE,
    EOS,
    batches,
    build_corpus,
    pack,
    render,
    tokenizer_files,
    train_tokenizer,
)
from demo_export import (  # noqa: E402
    ModelConfig,
    agreement,
    dequantized_weights,
    export_hf,
    greedy,
    mlx_logits,
    quantize,
)
from demo_jax import forward, init_params, token_losses  # noqa: E402


@dataclass(frozen=True)
class TrainConfig:
    steps: int  # optimizer steps
    batch_size: int  # rows of seq_len tokens per step
    lr: float  # peak learning rate (linear warmup, cosine decay to 10%)
    warmup: int = 50
    weight_decay: float = 0.1
    kl_weight: float = 0.0  # draft only: weight of KL(target || draft); CE gets 1 - kl_weight


def train(cfg: ModelConfig, tc: TrainConfig, data, seed: int, teacher=None, log=print):
    """AdamW training. With a teacher (params, cfg), the loss mixes KL to its logits with CE."""
    import jax
    import jax.numpy as jnp
    import optax

    params = init_params(cfg, jax.random.PRNGKey(seed))
    sched = optax.warmup_cosine_decay_schedule(0.0, tc.lr, tc.warmup, tc.steps, tc.lr * 0.1)
    decay_mask = {k: v.ndim == 2 for k, v in params.items()}
    opt = optax.chain(
        optax.clip_by_global_norm(1.0),
        optax.adamw(sched, b1=0.9, b2=0.95, weight_decay=tc.weight_decay, mask=decay_mask),
    )
    state = opt.init(params)

    def loss_fn(p, tokens, segments):
        inputs, in_segs = tokens[:, :-1], segments[:, :-1]
        logits = forward(p, cfg, inputs, in_segs)
        nll, valid = token_losses(logits, tokens, segments)
        ce = (nll * valid).sum() / valid.sum()
        if teacher is None:
            return ce, ce
        t_logp = jax.nn.log_softmax(forward(teacher[0], teacher[1], inputs, in_segs), -1)
        s_logp = jax.nn.log_softmax(logits, -1)
        kl = (jnp.exp(t_logp) * (t_logp - s_logp)).sum(-1)
        kl = (kl * valid).sum() / valid.sum()
        return tc.kl_weight * kl + (1 - tc.kl_weight) * ce, ce

    @jax.jit
    def step(p, s, tokens, segments):
        (loss, ce), grads = jax.value_and_grad(loss_fn, has_aux=True)(p, tokens, segments)
        updates, s = opt.update(grads, s, p)
        return optax.apply_updates(p, updates), s, loss, ce

    t0, seen = time.time(), 0
    for i, (tokens, segments) in zip(range(tc.steps), data):
        params, state, loss, ce = step(params, state, tokens, segments)
        seen += int((segments > 0).sum())
        if i % 25 == 0 or i == tc.steps - 1:
            dt = time.time() - t0
            log(
                f"  step {i:5d}  loss {float(loss):.4f}  ce {float(ce):.4f}  "
                f"{seen / max(dt, 1e-9):7.0f} tok/s  {dt:6.0f}s"
            )
    return params


def heldout_nll(params, cfg: ModelConfig, seqs, seq_len: int) -> float:
    """Mean next-token NLL over the held-out conversations (whole conversations, packed)."""
    import jax

    rows, segs = pack(seqs, seq_len, np.random.default_rng(0))

    @jax.jit
    def fn(p, t, s):
        nll, valid = token_losses(forward(p, cfg, t[:, :-1], s[:, :-1]), t, s)
        return (nll * valid).sum(), valid.sum()

    tot = cnt = 0.0
    for i in range(0, len(rows), 8):
        a, b = fn(params, rows[i : i + 8], segs[i : i + 8])
        tot, cnt = tot + float(a), cnt + float(b)
    return tot / cnt


# ---------------------------------------------------------------- main


TARGET = ModelConfig(
    hidden_size=256,
    num_hidden_layers=4,
    intermediate_size=768,
    num_attention_heads=4,
    num_key_value_heads=2,
)
DRAFT = ModelConfig(
    hidden_size=128,
    num_hidden_layers=2,
    intermediate_size=384,
    num_attention_heads=2,
    num_key_value_heads=1,
)


def n_params(params) -> int:
    return sum(int(np.prod(v.shape)) for v in params.values())


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("scratch/demo"), help="intermediates")
    ap.add_argument("--ship", type=Path, default=None, help="copy the 4-bit pair here")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vocab-size", type=int, default=2048)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--max-chars", type=int, default=1500, help="skip longer functions")
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--target-steps", type=int, default=1400)
    ap.add_argument("--draft-steps", type=int, default=1000)
    ap.add_argument("--target-lr", type=float, default=2e-3)
    ap.add_argument("--draft-lr", type=float, default=3e-3)
    ap.add_argument("--kl-weight", type=float, default=0.8)
    ap.add_argument(
        "--target-from",
        type=Path,
        default=None,
        help="skip target training: load an earlier run's OUT/target-hf",
    )
    ap.add_argument("--eval-prompts", type=Path, default=None, help="write held-out prompts here")
    ap.add_argument("--corpus-only", action="store_true", help="stop after the corpus + tokenizer")
    args = ap.parse_args(argv)
    t_start = time.time()
    log = lambda *a: print(*a, flush=True)  # noqa: E731

    # 1-2. corpus and tokenizer
    train_pairs, eval_pairs = build_corpus(args.seed, args.max_chars, holdout=0.05)
    tok_cfg = {"chat_template": CHAT_TEMPLATE}
    train_texts = [render(tok_cfg, p["prompt"], p["code"]) for p in train_pairs]
    eval_texts = [render(tok_cfg, p["prompt"], p["code"]) for p in eval_pairs]
    tok = train_tokenizer(train_texts, args.vocab_size)
    tok_files = tokenizer_files(tok)
    fits = lambda ids: len(ids) <= args.seq_len + 1  # noqa: E731
    train_ids = [e.ids for e in tok.encode_batch(train_texts) if fits(e.ids)]
    keep = [i for i, e in enumerate(tok.encode_batch(eval_texts)) if fits(e.ids)]
    eval_pairs = [eval_pairs[i] for i in keep]
    eval_ids = [tok.encode(eval_texts[i]).ids for i in keep]
    n_tok = sum(map(len, train_ids))
    chars = sum(map(len, train_texts))
    log(
        f"python {sys.version.split()[0]}: {len(train_ids)} train / {len(eval_ids)} held-out "
        f"conversations, {n_tok} train tokens ({chars / n_tok:.2f} chars/token)"
    )
    if args.eval_prompts:
        with open(args.eval_prompts, "w") as f:
            for p in eval_pairs:
                f.write(json.dumps({"prompt": p["prompt"], "where": p["where"]}) + "\n")
        log(f"wrote {len(eval_pairs)} held-out prompts to {args.eval_prompts}")
    if args.corpus_only:
        return 0

    import jax

    vocab = tok.get_vocab_size()
    target_cfg = replace(TARGET, vocab_size=vocab, max_position_embeddings=args.seq_len)
    draft_cfg = replace(DRAFT, vocab_size=vocab, max_position_embeddings=args.seq_len)

    # 3. target
    log(f"target: {target_cfg}")
    tc = TrainConfig(args.target_steps, args.batch_size, args.target_lr)
    t0 = time.time()
    if args.target_from:  # iterate on the draft alone: reuse an exported target
        from safetensors.numpy import load_file

        target = load_file(str(args.target_from / "model.safetensors"))
        log(f"target: loaded from {args.target_from}")
    else:
        target = train(
            target_cfg,
            tc,
            batches(train_ids, args.seq_len, tc.batch_size, args.seed),
            args.seed,
            log=log,
        )
    t_target = time.time() - t0
    nll_t = heldout_nll(target, target_cfg, eval_ids, args.seq_len)
    log(f"target: {n_params(target)} params, {t_target:.0f}s, held-out ppl {math.exp(nll_t):.3f}")

    # 4. draft, distilled from the target
    log(f"draft: {draft_cfg}")
    dc = TrainConfig(args.draft_steps, args.batch_size, args.draft_lr, kl_weight=args.kl_weight)
    t0 = time.time()
    draft = train(
        draft_cfg,
        dc,
        batches(train_ids, args.seq_len, dc.batch_size, args.seed + 1),
        args.seed + 1,
        teacher=(target, target_cfg),
        log=log,
    )
    t_draft = time.time() - t0
    nll_d = heldout_nll(draft, draft_cfg, eval_ids, args.seq_len)
    log(f"draft: {n_params(draft)} params, {t_draft:.0f}s, held-out ppl {math.exp(nll_d):.3f}")

    # 5. export and check against mlx-lm
    import mlx_lm

    figures = {
        "python": sys.version.split()[0],
        "train_conversations": len(train_ids),
        "heldout_conversations": len(eval_ids),
        "train_tokens": n_tok,
        "train_seconds": {"target": round(t_target), "draft": round(t_draft)},
    }
    models = {}
    check_ids = eval_ids[0]
    for name, params, cfg, nll_fp in (
        ("target", target, target_cfg, nll_t),
        ("draft", draft, draft_cfg, nll_d),
    ):
        hf, q = args.out / f"{name}-hf", args.out / f"{name}-4bit"
        shutil.rmtree(hf, ignore_errors=True)
        export_hf(params, cfg, tok, tok_files, hf)
        quantize(hf, q, tok, tok_files)
        qparams = dequantized_weights(q)
        nll_q = heldout_nll(qparams, cfg, eval_ids, args.seq_len)
        (model, _), (qmodel, qtok) = mlx_lm.load(str(hf)), mlx_lm.load(str(q))
        diffs = {}
        for kind, m, p in (("fp32", model, params), ("4bit", qmodel, qparams)):
            # mlx-lm's forward of the exported files must be our JAX forward of the same weights
            one = np.ones((1, len(check_ids)), np.int32)
            ref = np.asarray(forward(p, cfg, np.array([check_ids]), one))[0]
            got = mlx_logits(m, check_ids)
            diffs[kind] = float(np.abs(got - ref).max())
            log(
                f"{name} {kind}: mlx-lm logits vs JAX on a held-out conversation "
                f"({len(check_ids)} tokens): max |diff| {diffs[kind]:.2e}"
            )
            assert np.allclose(got, ref, atol=1e-3), f"{name} {kind} export does not match JAX"
        log(
            f"{name}: held-out ppl fp32 {math.exp(nll_fp):.3f} -> 4-bit {math.exp(nll_q):.3f}; "
            f"{dir_bytes(q)} bytes on disk (4-bit)"
        )
        models[name] = (model, qmodel, qtok)
        figures[name] = {
            "params": n_params(params),
            "config": asdict(cfg),
            "ppl_fp32": round(math.exp(nll_fp), 3),
            "ppl_4bit": round(math.exp(nll_q), 3),
            "bytes_4bit": dir_bytes(q),
            "logit_max_abs_diff": diffs,
        }

    # 6. acceptance estimate and an example
    eos = tok.token_to_id(EOS)
    qtok = models["target"][2]
    prompts = [
        qtok.apply_chat_template(
            [{"role": "user", "content": p["prompt"]}], add_generation_prompt=True
        )
        for p in eval_pairs[:20]
    ]
    assert prompts[0] == tok.encode(render(tok_cfg, eval_pairs[0]["prompt"])).ids
    for kind, i in (("fp32", 0), ("4bit", 1)):
        rate, n = agreement(models["target"][i], models["draft"][i], prompts, eos, 128)
        figures[f"greedy_agreement_{kind}"] = round(rate, 4)
        log(
            f"greedy agreement draft vs target ({kind}), 20 held-out prompts: {rate:.3f} "
            f"over {n} tokens"
        )
    example = qtok.decode(greedy(models["target"][1], prompts[0], eos, 200))
    figures["example"] = {"prompt": eval_pairs[0]["prompt"], "answer": example}
    log(f"example prompt: {eval_pairs[0]['prompt']}\n--- 4-bit target, greedy:\n{example}")
    figures["total_seconds"] = round(time.time() - t_start)
    (args.out / "figures.json").write_text(json.dumps(figures, indent=2) + "\n")

    if args.ship:
        for name in ("target", "draft"):
            shutil.rmtree(args.ship / name, ignore_errors=True)
            shutil.copytree(args.out / f"{name}-4bit", args.ship / name)
        log(f"shipped the 4-bit pair to {args.ship}")
    log(f"done in {time.time() - t_start:.0f}s; jax {jax.__version__}, mlx-lm {mlx_lm.__version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
