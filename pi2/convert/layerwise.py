# layerwise.py — the converter's forward pass, one layer at a time over every calibration token.
# Owns: the hidden states of all calibration tokens (chunks × tokens × n_embd, float32), and for each layer
#       in turn: its weights dequantized to float32, attention per chunk (causal, GQA, RoPE, sliding window),
#       the FFN's gate/up/down, a LayerPass handed to the caller, then the layer's weights released (and the
#       file's mapped pages dropped) before the next layer is touched. Peak memory is one layer's weights
#       plus the hidden states, so a model larger than memory can be profiled.
# Does not: compute statistics or predictors (profile.py, predictor.py), or follow llama.cpp's roundings:
#       float32 BLAS products on dequantized weights; the statistics it feeds are estimates anyway.
from __future__ import annotations

import gc
from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

from pi2.reference import sparse_ffn as sparse
from pi2.convert.profile import act_fn
from pi2.errors import ModelFormatError
from pi2.reference.quants import dequantize
from pi2.reference.forward import rope, rope_cache


@dataclass
class LayerPass:
    """What one layer computed for every calibration token (rows = chunks concatenated)."""
    il: int
    attn_in: np.ndarray       # attn_norm(residual entering the layer): what attention reads first
    x: np.ndarray             # ffn_norm(residual after attention): the FFN's input
    gate: np.ndarray          # gate(x), pre-activation (tokens, n_ff)
    up: np.ndarray            # up(x)
    act: np.ndarray           # act(gate)
    down: np.ndarray          # (n_embd, n_ff) float32, source neuron order
    gate_w: np.ndarray        # (n_ff, n_embd) float32 gate weights, source neuron order
    weights: dict             # the layer's weights as sparse.ffn_weights returns them (raw bytes, types)


def _f32(q) -> np.ndarray:
    return dequantize(q.raw, q.qtype, q.n_in)


def _rms(x, w, eps):
    y = x / np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=-1, keepdims=True) + eps).astype(np.float32)
    return y * w if w is not None else y


def _attention(q, k, v, scale, window):
    """q (T, H, d), k/v (T, Hkv, d): causal softmax attention in float32 -> (T, H*dv)."""
    T, H, _ = q.shape
    g = H // k.shape[1]
    k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    s = np.einsum("thd,shd->hts", q, k, optimize=True) * np.float32(scale)
    i = np.arange(T)
    masked = i[None, :] > i[:, None]
    if window:
        masked |= (i[:, None] - i[None, :]) >= window
    s[:, masked] = -np.inf
    s -= s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=-1, keepdims=True)
    return np.einsum("hts,shd->thd", p, v, optimize=True).reshape(T, -1)


def run_layers(model, chunks, progress: bool = True):
    """Yield a LayerPass per layer, in order. chunks: lists of token ids, each its own sequence from position 0.
    The caller must finish with a LayerPass before asking for the next one (its arrays are reused)."""
    cfg, f = model.config, model.file
    vec = lambda name: np.asarray(model.raw(name).view(np.float32).reshape(-1))  # noqa: E731
    emb = model.tensor("token_embd.weight")
    ids = np.concatenate([np.asarray(c, np.int64) for c in chunks])
    raw = np.asarray(model.raw(emb.name))
    h = dequantize(np.ascontiguousarray(raw[ids]), emb.type, emb.ne[0])
    if cfg.embd_scale != 1.0:
        h *= np.float32(cfg.embd_scale)
    bounds = np.cumsum([0] + [len(c) for c in chunks])
    act = act_fn(cfg.ffn_act)
    ropes: dict = {}
    eps = cfg.rms_eps
    rope_freqs = vec("rope_freqs.weight") if "rope_freqs.weight" in f.tensors else None
    for il in tqdm(range(cfg.n_layer), desc="profile", unit="layer", disable=not progress):
        b = f"blk.{il}."
        lin = {n: _f32(sparse._rows(model.raw(b + n + ".weight"), model.tensor(b + n + ".weight").type,
                                    model.tensor(b + n + ".weight").ne[0]))
               for n in ("attn_q", "attn_k", "attn_v", "attn_output")}
        W = sparse.ffn_weights(model, il)
        if "ffn_gate" not in W:
            raise ModelFormatError(f"{model.path}: layer {il} has no ffn_gate to profile")
        wg, wu = _f32(W["ffn_gate"]), _f32(W["ffn_up"])
        down = _f32(W["ffn_down"]) if "ffn_down" in W else np.ascontiguousarray(_f32(W["down_rows"]).T)
        an = _rms(h, vec(b + "attn_norm.weight"), eps)
        a = np.empty((h.shape[0], cfg.n_head * cfg.head_dim_v), np.float32)
        base = cfg.layer_rope_base(il)
        window = cfg.sliding_window if cfg.is_swa_layer(il) else 0
        for c0, c1 in zip(bounds[:-1], bounds[1:]):
            x = an[c0:c1]
            q, k, v = x @ lin["attn_q"].T, x @ lin["attn_k"].T, x @ lin["attn_v"].T
            if cfg.qkv_bias:
                q, k, v = q + vec(b + "attn_q.bias"), k + vec(b + "attn_k.bias"), v + vec(b + "attn_v.bias")
            n = c1 - c0
            q = q.reshape(n, cfg.n_head, cfg.head_dim)
            k = k.reshape(n, cfg.n_head_kv, cfg.head_dim)
            v = v.reshape(n, cfg.n_head_kv, cfg.head_dim_v)
            if cfg.qk_norm:
                q, k = _rms(q, vec(b + "attn_q_norm.weight"), eps), _rms(k, vec(b + "attn_k_norm.weight"), eps)
            key = (base, n)
            if key not in ropes:
                ropes[key] = rope_cache(np.arange(n), cfg.n_rot, base, cfg.rope_freq_scale, rope_freqs)
            cos, sin = ropes[key]
            q, k = rope(q, cos, sin, cfg.n_rot, cfg.rope_neox), rope(k, cos, sin, cfg.n_rot, cfg.rope_neox)
            a[c0:c1] = _attention(q, k, v, cfg.attn_scale, window)
        a = a @ lin["attn_output"].T
        if cfg.post_norms:
            a = _rms(a, vec(b + "post_attention_norm.weight"), eps)
        h += a
        x = _rms(h, vec(b + "ffn_norm.weight"), eps)
        g, u = x @ wg.T, x @ wu.T
        ag = act(g)
        y = np.empty_like(h)
        for c0, c1 in zip(bounds[:-1], bounds[1:]):          # act·up a chunk at a time: one (tokens, n_ff) less
            hh = np.maximum(g[c0:c1], 0) * np.maximum(u[c0:c1], 0) if cfg.ffn_act == "drelu" else ag[c0:c1] * u[c0:c1]
            y[c0:c1] = hh @ down.T
        if cfg.post_norms:
            y = _rms(y, vec(b + "post_ffw_norm.weight"), eps)
        yield LayerPass(il, an, x, g, u, ag, down, wg, W)
        h += y
        del lin, W, wg, wu, down, an, a, x, g, u, ag, hh, y
        gc.collect()
        drop = getattr(f, "drop_pages", None)
        if drop is not None:
            drop()
