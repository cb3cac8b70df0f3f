"""The demo models in JAX: a Llama under mlx-lm's parameter names, its forward pass and loss.

Dev-only. JAX is imported inside the functions, so the caller sets XLA's flags first.
"""

from __future__ import annotations

import math

from demo_export import ModelConfig


def init_params(cfg: ModelConfig, key) -> dict:
    """Parameters under mlx-lm's llama names, linear weights as [out, in] (the HF layout)."""
    import jax
    import jax.numpy as jnp

    d, f, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    keys = iter(jax.random.split(key, 1 + 7 * cfg.num_hidden_layers))
    out_std = 0.02 / math.sqrt(2 * cfg.num_hidden_layers)

    def normal(shape, std=0.02):
        return std * jax.random.normal(next(keys), shape, jnp.float32)

    p = {
        "model.embed_tokens.weight": normal((cfg.vocab_size, d)),
        "model.norm.weight": jnp.ones((d,), jnp.float32),
    }
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


def rms_norm(x, w, eps: float):
    import jax
    import jax.numpy as jnp

    return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + eps) * w


def blocks(p: dict, cfg: ModelConfig, h, segments, prefix: str, layers: int):
    """Llama decoder layers `prefix{i}.` over a residual stream h [B, T, D]; attention causal
    within a segment; RoPE as mlx-lm's (non-traditional), positions 0 .. T-1."""
    import jax
    import jax.numpy as jnp

    B, T, _ = h.shape
    H, KV, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    inv_freq = cfg.rope_theta ** (-jnp.arange(0, hd, 2, dtype=jnp.float32) / hd)
    angles = jnp.arange(T, dtype=jnp.float32)[:, None] * inv_freq[None, :]  # [T, hd/2]
    cos, sin = jnp.cos(angles), jnp.sin(angles)

    def rope(x):  # [B, T, heads, hd]; rotate halves, like HF's rotate_half
        x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
        c, s = cos[None, :, None, :], sin[None, :, None, :]
        return jnp.concatenate([x1 * c - x2 * s, x1 * s + x2 * c], -1)

    causal = jnp.tril(jnp.ones((T, T), bool))
    mask = causal[None] & (segments[:, :, None] == segments[:, None, :])  # [B, T, T]
    eps = cfg.rms_norm_eps
    for i in range(layers):
        pre = f"{prefix}{i}."
        x = rms_norm(h, p[pre + "input_layernorm.weight"], eps)
        q = (x @ p[pre + "self_attn.q_proj.weight"].T).reshape(B, T, H, hd)
        k = (x @ p[pre + "self_attn.k_proj.weight"].T).reshape(B, T, KV, hd)
        v = (x @ p[pre + "self_attn.v_proj.weight"].T).reshape(B, T, KV, hd)
        q, k = rope(q), rope(k)
        k, v = jnp.repeat(k, H // KV, axis=2), jnp.repeat(v, H // KV, axis=2)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) * hd**-0.5
        scores = jnp.where(mask[:, None], scores, -1e9)
        att = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, -1), v).reshape(B, T, H * hd)
        h = h + att @ p[pre + "self_attn.o_proj.weight"].T
        x = rms_norm(h, p[pre + "post_attention_layernorm.weight"], eps)
        gate = jax.nn.silu(x @ p[pre + "mlp.gate_proj.weight"].T)
        h = h + (gate * (x @ p[pre + "mlp.up_proj.weight"].T)) @ p[pre + "mlp.down_proj.weight"].T
    return h


def forward(p: dict, cfg: ModelConfig, tokens, segments):
    """Logits [B, T, V] of the whole model (tied embeddings)."""
    h = p["model.embed_tokens.weight"][tokens]
    h = blocks(p, cfg, h, segments, "model.layers.", cfg.num_hidden_layers)
    h = rms_norm(h, p["model.norm.weight"], cfg.rms_norm_eps)
    return h @ p["model.embed_tokens.weight"].T


def token_losses(logits, tokens, segments):
    """Next-token NLL of logits over tokens[:, :-1], and the mask of predictions that count."""
    import jax
    import jax.numpy as jnp

    logp = jax.nn.log_softmax(logits, -1)
    nll = -jnp.take_along_axis(logp, tokens[:, 1:, None], -1)[..., 0]
    valid = (segments[:, 1:] == segments[:, :-1]) & (segments[:, 1:] > 0)
    return nll, valid.astype(jnp.float32)
