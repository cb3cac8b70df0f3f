"""Train the shipped demo pair: a small Llama target and a distilled draft, one shared tokenizer.

Dev-only (`pip install -e '.[train]'`); nothing here is imported at run time.

    python scripts/train_demo_pair.py --out scratch/demo --ship macspec/demo

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
import ast  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import random  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import sysconfig  # noqa: E402
import textwrap  # noqa: E402
import time  # noqa: E402
from dataclasses import asdict, dataclass, replace  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

BOS, EOS, PAD = "<|begin|>", "<|end|>", "<|pad|>"
SPECIAL_TOKENS = [BOS, EOS, PAD, "<|system|>", "<|user|>", "<|assistant|>"]
# Every turn is "<|role|>\n{content}<|end|>"; <|end|> is also the EOS that stops generation.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('roles are system, user and assistant') }}{% endif %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)
SKIP_DIRS = {"test", "tests", "idlelib", "lib2to3", "site-packages", "dist-packages", "turtledemo",
             "ensurepip", "pydoc_data", "__pycache__", "venv"}


@dataclass(frozen=True)
class ModelConfig:
    hidden_size: int  # d_model; a multiple of 64 so 4-bit group-64 quantization applies
    num_hidden_layers: int
    intermediate_size: int  # SwiGLU hidden width
    num_attention_heads: int
    num_key_value_heads: int  # < heads means grouped-query attention
    vocab_size: int = 2048
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 512  # the training context; longer is untrained

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


@dataclass(frozen=True)
class TrainConfig:
    steps: int  # optimizer steps
    batch_size: int  # rows of seq_len tokens per step
    lr: float  # peak learning rate (linear warmup, cosine decay to 10%)
    warmup: int = 50
    weight_decay: float = 0.1
    kl_weight: float = 0.0  # draft only: weight of KL(target || draft); CE gets 1 - kl_weight


# ---------------------------------------------------------------- 1. corpus


def stdlib_files(root: Path) -> list[Path]:
    """The stdlib .py files worth learning from, sorted for determinism."""
    files = []
    for path in root.rglob("*.py"):
        parts = set(path.relative_to(root).parts[:-1])
        if parts & SKIP_DIRS or path.name.startswith("test_") or "config-" in str(path):
            continue
        files.append(path)
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def function_pairs(path: Path, root: Path, max_chars: int) -> list[dict]:
    """(prompt, source) pairs for every documented function or method of one file."""
    try:
        src = path.read_text(encoding="utf-8")
        tree = ast.parse(src)
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return []
    lines = src.splitlines()
    module = path.relative_to(root).with_suffix("").as_posix().replace("/", ".")
    pairs = []

    def visit(node, owner: str | None):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, child.name)
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                pair = make_pair(child, owner)
                if pair:
                    pairs.append(pair)

    def make_pair(fn, owner):
        doc = ast.get_docstring(fn)
        if not doc:
            return None
        code = textwrap.dedent("\n".join(lines[fn.lineno - 1 : fn.end_lineno])).strip("\n")
        if len(code) > max_chars or not code.startswith(("def ", "async def ")):
            return None
        summary = " ".join(doc.strip().split("\n\n")[0].split())
        name = f"{fn.name}({ast.unparse(fn.args)})"
        kind = f"method `{owner}.{name}`" if owner else f"function `{name}`"
        prompt = f"Write a Python {kind}: {summary}"
        where = ".".join(x for x in (module, owner, fn.name) if x)
        return {"prompt": prompt, "code": code, "where": where}

    visit(tree, None)
    return pairs


def render(tokenizer_config: dict, prompt: str, answer: str | None = None) -> str:
    """The chat template applied with jinja2, exactly as transformers would."""
    import jinja2

    def raise_exception(message):
        raise ValueError(message)

    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    messages = [{"role": "user", "content": prompt}]
    if answer is not None:
        messages.append({"role": "assistant", "content": answer})
    return env.from_string(tokenizer_config["chat_template"]).render(
        messages=messages, add_generation_prompt=answer is None, bos_token=BOS, eos_token=EOS)


def build_corpus(seed: int, max_chars: int, holdout: float) -> tuple[list[dict], list[dict]]:
    root = Path(sysconfig.get_paths()["stdlib"])
    pairs, seen = [], set()
    for path in stdlib_files(root):
        for pair in function_pairs(path, root, max_chars):
            if pair["code"] not in seen:  # the stdlib repeats a few functions verbatim
                seen.add(pair["code"])
                pairs.append(pair)
    random.Random(seed).shuffle(pairs)
    n_eval = max(20, round(holdout * len(pairs)))
    return pairs[n_eval:], pairs[:n_eval]


# ---------------------------------------------------------------- 2. tokenizer


def train_tokenizer(texts: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def tokenizer_files(tok) -> dict[str, dict]:
    """tokenizer_config.json and special_tokens_map.json for a transformers fast tokenizer."""
    added = {str(tok.token_to_id(t)): {"content": t, "lstrip": False, "normalized": False,
                                       "rstrip": False, "single_word": False, "special": True}
             for t in SPECIAL_TOKENS}
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOS,
              "pad_token": PAD, "add_bos_token": False, "add_eos_token": False,
              "clean_up_tokenization_spaces": False, "model_max_length": 512,
              "added_tokens_decoder": added, "chat_template": CHAT_TEMPLATE}
    special = {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD}
    return {"tokenizer_config.json": config, "special_tokens_map.json": special}


def pack(seqs: list[list[int]], seq_len: int, rng: np.random.Generator):
    """Shuffle whole conversations into rows of seq_len + 1 tokens; segment ids mask across them."""
    order = rng.permutation(len(seqs))
    rows, segs, row, seg, n = [], [], [], [], 0
    for i in order:
        s = seqs[i]
        if len(row) + len(s) > seq_len + 1:
            rows.append(row + [0] * (seq_len + 1 - len(row)))
            segs.append(seg + [0] * (seq_len + 1 - len(seg)))
            row, seg = [], []
        n += 1
        row, seg = row + s, seg + [n] * len(s)
    if row:
        rows.append(row + [0] * (seq_len + 1 - len(row)))
        segs.append(seg + [0] * (seq_len + 1 - len(seg)))
    return np.array(rows, np.int32), np.array(segs, np.int32)


def batches(seqs, seq_len: int, batch_size: int, seed: int):
    """Endless (tokens, segments) batches, one fresh packing per epoch."""
    rng = np.random.default_rng(seed)
    while True:
        rows, segs = pack(seqs, seq_len, rng)
        for i in range(0, len(rows) - batch_size + 1, batch_size):
            yield rows[i : i + batch_size], segs[i : i + batch_size]


# ---------------------------------------------------------------- 3. the model, in JAX


def init_params(cfg: ModelConfig, key) -> dict:
    """Parameters under mlx-lm's llama names, linear weights as [out, in] (the HF layout)."""
    import jax
    import jax.numpy as jnp

    d, f, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    keys = iter(jax.random.split(key, 1 + 7 * cfg.num_hidden_layers))
    out_std = 0.02 / math.sqrt(2 * cfg.num_hidden_layers)

    def normal(shape, std=0.02):
        return std * jax.random.normal(next(keys), shape, jnp.float32)

    p = {"model.embed_tokens.weight": normal((cfg.vocab_size, d)),
         "model.norm.weight": jnp.ones((d,), jnp.float32)}
    for i in range(cfg.num_hidden_layers):
        pre = f"model.layers.{i}."
        p[pre + "self_attn.q_proj.weight"] = normal((cfg.num_attention_heads * hd, d))
        p[pre + "self_attn.k_proj.weight"] = normal((cfg.num_key_value_heads * hd, d))
        p[pre + "self_attn.v_proj.weight"] = normal((cfg.num_key_value_heads * hd, d))
        p[pre + "self_attn.o_proj.weight"] = normal((d, cfg.num_attention_heads * hd), out_std)
        p[pre + "mlp.gate_proj.weight"] = normal((f, d))
        p[pre + "mlp.up_proj.weight"] = normal((f, d))
        p[pre + "mlp.down_proj.weight"] = normal((d, f), out_std)
        p[pre + "input_layernorm.weight"] = jnp.ones((d,), jnp.float32)
        p[pre + "post_attention_layernorm.weight"] = jnp.ones((d,), jnp.float32)
    return p


def forward(p: dict, cfg: ModelConfig, tokens, segments):
    """Logits [B, T, V]; attention causal within a segment; RoPE as mlx-lm's (non-traditional)."""
    import jax
    import jax.numpy as jnp

    B, T = tokens.shape
    H, KV, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim

    def rms_norm(x, w):
        return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + cfg.rms_norm_eps) * w

    inv_freq = cfg.rope_theta ** (-jnp.arange(0, hd, 2, dtype=jnp.float32) / hd)
    angles = jnp.arange(T, dtype=jnp.float32)[:, None] * inv_freq[None, :]  # [T, hd/2]
    cos, sin = jnp.cos(angles), jnp.sin(angles)

    def rope(x):  # [B, T, heads, hd]; rotate halves, like HF's rotate_half
        x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
        c, s = cos[None, :, None, :], sin[None, :, None, :]
        return jnp.concatenate([x1 * c - x2 * s, x1 * s + x2 * c], -1)

    causal = jnp.tril(jnp.ones((T, T), bool))
    mask = causal[None] & (segments[:, :, None] == segments[:, None, :])  # [B, T, T]
    h = p["model.embed_tokens.weight"][tokens]
    for i in range(cfg.num_hidden_layers):
        pre = f"model.layers.{i}."
        x = rms_norm(h, p[pre + "input_layernorm.weight"])
        q = (x @ p[pre + "self_attn.q_proj.weight"].T).reshape(B, T, H, hd)
        k = (x @ p[pre + "self_attn.k_proj.weight"].T).reshape(B, T, KV, hd)
        v = (x @ p[pre + "self_attn.v_proj.weight"].T).reshape(B, T, KV, hd)
        q, k = rope(q), rope(k)
        k, v = jnp.repeat(k, H // KV, axis=2), jnp.repeat(v, H // KV, axis=2)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) * hd**-0.5
        scores = jnp.where(mask[:, None], scores, -1e9)
        att = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, -1), v).reshape(B, T, H * hd)
        h = h + att @ p[pre + "self_attn.o_proj.weight"].T
        x = rms_norm(h, p[pre + "post_attention_layernorm.weight"])
        gate = jax.nn.silu(x @ p[pre + "mlp.gate_proj.weight"].T)
        h = h + (gate * (x @ p[pre + "mlp.up_proj.weight"].T)) @ p[pre + "mlp.down_proj.weight"].T
    h = rms_norm(h, p["model.norm.weight"])
    return h @ p["model.embed_tokens.weight"].T  # tied embeddings


def token_losses(logits, tokens, segments):
    """Next-token NLL of logits over tokens[:, :-1], and the mask of predictions that count."""
    import jax
    import jax.numpy as jnp

    logp = jax.nn.log_softmax(logits, -1)
    nll = -jnp.take_along_axis(logp, tokens[:, 1:, None], -1)[..., 0]
    valid = (segments[:, 1:] == segments[:, :-1]) & (segments[:, 1:] > 0)
    return nll, valid.astype(jnp.float32)


def train(cfg: ModelConfig, tc: TrainConfig, data, seed: int, teacher=None, log=print):
    """AdamW training. With a teacher (params, cfg), the loss mixes KL to its logits with CE."""
    import jax
    import jax.numpy as jnp
    import optax

    params = init_params(cfg, jax.random.PRNGKey(seed))
    sched = optax.warmup_cosine_decay_schedule(0.0, tc.lr, tc.warmup, tc.steps, tc.lr * 0.1)
    decay_mask = {k: v.ndim == 2 for k, v in params.items()}
    opt = optax.chain(optax.clip_by_global_norm(1.0),
                      optax.adamw(sched, b1=0.9, b2=0.95, weight_decay=tc.weight_decay,
                                  mask=decay_mask))
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
            log(f"  step {i:5d}  loss {float(loss):.4f}  ce {float(ce):.4f}  "
                f"{seen / max(dt, 1e-9):7.0f} tok/s  {dt:6.0f}s")
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


# ---------------------------------------------------------------- 5. export


def export_hf(params, cfg: ModelConfig, tok, tok_files: dict, path: Path) -> None:
    from safetensors.numpy import save_file

    path.mkdir(parents=True, exist_ok=True)
    weights = {k: np.asarray(v, np.float32) for k, v in params.items()}
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **asdict(cfg),
              "head_dim": cfg.head_dim, "hidden_act": "silu", "tie_word_embeddings": True,
              "attention_bias": False, "mlp_bias": False, "rope_traditional": False,
              "bos_token_id": tok.token_to_id(BOS), "eos_token_id": tok.token_to_id(EOS),
              "pad_token_id": tok.token_to_id(PAD), "torch_dtype": "float32"}
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    write_tokenizer(tok, tok_files, path)


def write_tokenizer(tok, tok_files: dict, path: Path) -> None:
    tok.save(str(path / "tokenizer.json"))
    for name, content in tok_files.items():
        (path / name).write_text(json.dumps(content, indent=2) + "\n")


def quantize(src: Path, dst: Path, tok, tok_files: dict) -> None:
    """4-bit, group 64, with mlx-lm's own converter; keep only the model files.

    Scales and biases stay float32: MLX's CPU backend runs float16 ~80x slower (Metal does not).
    """
    from mlx_lm import convert

    shutil.rmtree(dst, ignore_errors=True)
    convert(str(src), str(dst), quantize=True, q_bits=4, q_group_size=64, dtype="float32")
    keep = {"config.json", "model.safetensors", "tokenizer.json", *tok_files}
    for f in dst.iterdir():
        if f.name not in keep:
            f.unlink()
    write_tokenizer(tok, tok_files, dst)  # ours, byte-for-byte, not a re-save by transformers


# ---------------------------------------------------------------- 6. checks with mlx-lm


def mlx_logits(model, ids: list[int]) -> np.ndarray:
    import mlx.core as mx

    out = model(mx.array([ids]))[0].astype(mx.float32)
    return np.array(out)


def dequantized_weights(path: Path) -> dict:
    """The 4-bit checkpoint's weights as the float32 arrays its quantized matmuls compute with."""
    import mlx.core as mx

    q = json.loads((path / "config.json").read_text())["quantization"]
    raw = mx.load(str(path / "model.safetensors"))
    out = {}
    for k, v in raw.items():
        if k.endswith((".scales", ".biases")):
            continue
        stem = k[: -len(".weight")]
        if stem + ".scales" in raw:
            v = mx.dequantize(v, raw[stem + ".scales"], raw[stem + ".biases"],
                              group_size=q["group_size"], bits=q["bits"])
        out[k] = np.array(v.astype(mx.float32))
    return out


def greedy(model, prompt: list[int], eos: int, max_tokens: int) -> list[int]:
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    out = []
    for token, _ in generate_step(mx.array(prompt), model, max_tokens=max_tokens):
        out.append(int(token))
        if out[-1] == eos:
            break
    return out


def agreement(target, draft, prompts: list[list[int]], eos: int, max_tokens: int):
    """Fraction of target-greedy positions where the draft's argmax is the target's token."""
    hits = total = 0
    for prompt in prompts:
        cont = greedy(target, prompt, eos, max_tokens)
        logits = mlx_logits(draft, prompt + cont)[len(prompt) - 1 : -1]
        hits += int((logits.argmax(-1) == np.array(cont)).sum())
        total += len(cont)
    return hits / total, total


# ---------------------------------------------------------------- main


TARGET = ModelConfig(hidden_size=256, num_hidden_layers=4, intermediate_size=768,
                     num_attention_heads=4, num_key_value_heads=2)
DRAFT = ModelConfig(hidden_size=128, num_hidden_layers=2, intermediate_size=384,
                    num_attention_heads=2, num_key_value_heads=1)


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
    ap.add_argument("--target-from", type=Path, default=None,
                    help="skip target training: load an earlier run's OUT/target-hf")
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
    log(f"python {sys.version.split()[0]}: {len(train_ids)} train / {len(eval_ids)} held-out "
        f"conversations, {n_tok} train tokens ({chars / n_tok:.2f} chars/token)")
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
        target = train(target_cfg, tc, batches(train_ids, args.seq_len, tc.batch_size, args.seed),
                       args.seed, log=log)
    t_target = time.time() - t0
    nll_t = heldout_nll(target, target_cfg, eval_ids, args.seq_len)
    log(f"target: {n_params(target)} params, {t_target:.0f}s, held-out ppl {math.exp(nll_t):.3f}")

    # 4. draft, distilled from the target
    log(f"draft: {draft_cfg}")
    dc = TrainConfig(args.draft_steps, args.batch_size, args.draft_lr, kl_weight=args.kl_weight)
    t0 = time.time()
    draft = train(draft_cfg, dc, batches(train_ids, args.seq_len, dc.batch_size, args.seed + 1),
                  args.seed + 1, teacher=(target, target_cfg), log=log)
    t_draft = time.time() - t0
    nll_d = heldout_nll(draft, draft_cfg, eval_ids, args.seq_len)
    log(f"draft: {n_params(draft)} params, {t_draft:.0f}s, held-out ppl {math.exp(nll_d):.3f}")

    # 5. export and check against mlx-lm
    import mlx_lm

    figures = {"python": sys.version.split()[0], "train_conversations": len(train_ids),
               "heldout_conversations": len(eval_ids), "train_tokens": n_tok,
               "train_seconds": {"target": round(t_target), "draft": round(t_draft)}}
    models = {}
    check_ids = eval_ids[0]
    for name, params, cfg, nll_fp in (("target", target, target_cfg, nll_t),
                                      ("draft", draft, draft_cfg, nll_d)):
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
            log(f"{name} {kind}: mlx-lm logits vs JAX on a held-out conversation "
                f"({len(check_ids)} tokens): max |diff| {diffs[kind]:.2e}")
            assert np.allclose(got, ref, atol=1e-3), f"{name} {kind} export does not match JAX"
        log(f"{name}: held-out ppl fp32 {math.exp(nll_fp):.3f} -> 4-bit {math.exp(nll_q):.3f}; "
            f"{dir_bytes(q)} bytes on disk (4-bit)")
        models[name] = (model, qmodel, qtok)
        figures[name] = {"params": n_params(params), "config": asdict(cfg),
                         "ppl_fp32": round(math.exp(nll_fp), 3),
                         "ppl_4bit": round(math.exp(nll_q), 3),
                         "bytes_4bit": dir_bytes(q), "logit_max_abs_diff": diffs}

    # 6. acceptance estimate and an example
    eos = tok.token_to_id(EOS)
    qtok = models["target"][2]
    prompts = [qtok.apply_chat_template([{"role": "user", "content": p["prompt"]}],
                                        add_generation_prompt=True) for p in eval_pairs[:20]]
    assert prompts[0] == tok.encode(render(tok_cfg, eval_pairs[0]["prompt"])).ids
    for kind, i in (("fp32", 0), ("4bit", 1)):
        rate, n = agreement(models["target"][i], models["draft"][i], prompts, eos, 128)
        figures[f"greedy_agreement_{kind}"] = round(rate, 4)
        log(f"greedy agreement draft vs target ({kind}), 20 held-out prompts: {rate:.3f} "
            f"over {n} tokens")
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
