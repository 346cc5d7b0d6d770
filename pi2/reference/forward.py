"""forward.py — the numpy forward pass: the executable specification of what pi2 computes.

It computes what llama.cpp's CPU backend computes (flash attention off), roundings included:
activations are quantized to the weight type's dot-product format before every matrix product
(quants.QuantLinear), K and V are stored as F16, Q is rounded to F16 for K·Q and the softmax weights
to F16 for the product with V, GELU goes through F16 as ggml's table does, and RoPE angles are built
by repeated float32 multiplication. Summation orders, FMAs and SIMD lanes follow ggml's x86 build
(ggml_order.py, qdot.py), the sparse FFN in sparse_ffn.py, so on x86 llama.cpp's tensors are reproduced bit for bit for the kernels
these models use. One function per concept; `ReferenceContext` holds a KV cache.
Also serves `pi2 run --engine reference`.
"""
from __future__ import annotations

import numpy as np

from pi2.errors import UsageError
from pi2.model.loader import Model
from pi2.reference import ggml_order as go
from pi2.reference import sparse_ffn as sparse
from pi2.reference.flash_attn import flash_attention
from pi2.reference.kv_cache import fwht, make_keys, make_values
from pi2.reference.quants import QuantLinear
from pi2.runtime.ffn_rule import choose_rule

F16 = np.float16


def rms_norm(x: np.ndarray, w: np.ndarray | None, eps: float) -> np.ndarray:
    """ggml_rms_norm (float32 squares summed in order into a double, scale in float) then the weight multiply."""
    ss = go.sum_sq_f64(x)[..., None]
    mean = (ss / x.shape[-1]).astype(np.float32)
    scale = np.float32(1.0) / np.sqrt(mean + np.float32(eps))
    y = x * scale
    return y * w if w is not None else y


def rope_cache(pos: np.ndarray, n_rot: int, base: float, freq_scale: float, freq_factors=None):
    """cos/sin (n_tok, n_rot/2) as ggml_rope_cache_init builds them (float32 theta steps, libm sincosf)."""
    rows = [go.rope_row(int(p), n_rot, base, freq_scale, freq_factors) for p in pos]
    return np.stack([r[0] for r in rows]), np.stack([r[1] for r in rows])


def rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, n_rot: int, neox: bool) -> np.ndarray:
    """ggml_rope's rotate_pairs on the first n_rot dims of every head, x (n_tok, n_heads, head_dim).
    NORMAL pairs are (2i, 2i+1), NEOX pairs (i, i + n_rot/2)."""
    y = x.copy()
    c, s = cos[:, None, :], sin[:, None, :]
    if neox:
        h = n_rot // 2
        y[..., :h], y[..., h:n_rot] = go.rope_rotate(x[..., :h], x[..., h:n_rot], c, s)
    else:
        y[..., 0:n_rot:2], y[..., 1:n_rot:2] = go.rope_rotate(x[..., 0:n_rot:2], x[..., 1:n_rot:2], c, s)
    return y


def attention(q, k_cache, v_cache, pos, n_kv, scale, window=0, trace=None, kq_fn=None):
    """Causal GQA attention over an F16 cache, FA off. q (n_tok, n_head, hd) float32; caches (n_ctx, n_head_kv,
    hd) float16; pos (n_tok,) positions of the queries; keys 0..n_kv-1. Returns (n_tok, n_head*hd_v).
    K·Q and softmax·V are ggml mul_mats on F16: tinyBLAS for batches, ggml_vec_dot_f16 for one token.
    kq_fn: K·Q of a quantized K cache instead (kv_cache.QuantKeys.kq: (hkv, m, hd) float32 -> (hkv, m, n_kv))."""
    n_tok, n_head, hd = q.shape
    n_head_kv = v_cache.shape[1]
    g = n_head // n_head_kv
    dot = go.dot_f16_tinyblas if n_tok > 1 else go.dot_f16_vec
    vt = v_cache[:n_kv].astype(np.float32).transpose(1, 2, 0)                    # (hkv, hd_v, n_kv)
    if kq_fn is None:
        k = k_cache[:n_kv].astype(np.float32).transpose(1, 0, 2)                 # (hkv, n_kv, hd)
        qh = q.astype(F16).astype(np.float32).reshape(n_tok, n_head_kv, g, hd).transpose(1, 2, 0, 3)
        kq = dot(k, qh.reshape(n_head_kv, g * n_tok, hd)).reshape(n_head_kv, g, n_tok, n_kv)
    else:
        qh = np.asarray(q, np.float32).reshape(n_tok, n_head_kv, g, hd).transpose(1, 2, 0, 3)
        kq = kq_fn(np.ascontiguousarray(qh.reshape(n_head_kv, g * n_tok, hd))).reshape(n_head_kv, g, n_tok, n_kv)
    kpos = np.arange(n_kv)
    masked = kpos[None, :] > pos[:, None]
    if window:
        masked |= (pos[:, None] - kpos[None, :]) >= window
    p = go.softmax(kq, scale, masked)
    if trace:
        trace("kq_soft_max", p.reshape(n_head, n_tok, n_kv))
    p = p.astype(F16).astype(np.float32)
    out = dot(vt, p.reshape(n_head_kv, g * n_tok, n_kv))                         # (hkv, g*n, hdv)
    return out.reshape(n_head_kv, g, n_tok, -1).transpose(2, 0, 1, 3).reshape(n_tok, -1)


class ReferenceWeights:
    """The model's tensors as float32 norms/biases and QuantLinear matrices (dequantized lazily)."""

    def __init__(self, model: Model):
        cfg = model.config
        self.model, self.cfg = model, cfg
        vec = lambda name: np.asarray(model.raw(name).view(np.float32).reshape(-1))  # noqa: E731
        lin = lambda name: QuantLinear.from_raw(model.raw(name), model.tensor(name).type,  # noqa: E731
                                                model.tensor(name).ne[0])
        self.token_embd = lin("token_embd.weight")
        self.output = self.token_embd if model.tied_output else lin("output.weight")
        self.output_norm = vec("output_norm.weight")
        self.rope_freqs = vec("rope_freqs.weight") if model.rope_freqs else None
        self.layers = []
        for il in range(cfg.n_layer):
            b = f"blk.{il}."
            L = {n: lin(b + n + ".weight") for n in ("attn_q", "attn_k", "attn_v", "attn_output")}
            L.update(sparse.ffn_weights(model, il))     # dense, PowerInfer ffn_down_t or pi2 bundles
            L["attn_norm"], L["ffn_norm"] = vec(b + "attn_norm.weight"), vec(b + "ffn_norm.weight")
            if cfg.qkv_bias:
                for n in ("q", "k", "v"):
                    L[f"b{n}"] = vec(b + f"attn_{n}.bias")
            if cfg.qk_norm:
                L["q_norm"], L["k_norm"] = vec(b + "attn_q_norm.weight"), vec(b + "attn_k_norm.weight")
            if cfg.post_norms:
                L["post_attn"], L["post_ffw"] = vec(b + "post_attention_norm.weight"), vec(b + "post_ffw_norm.weight")
            self.layers.append(L)


class ReferenceContext:
    """A sequence being evaluated: the F16 KV cache and the position of the next token."""

    def __init__(self, model: Model, n_ctx: int, rule=None, weights: ReferenceWeights | None = None,
                 ctx_shift: bool = False, n_keep: int = 0, type_k: int = 1, flash_attn: bool = False,
                 type_v: int = 1):
        """rule: the run's runtime.ffn_rule.FFNRule (which neurons each token computes); None: the file's own rule,
        choose_rule(model). ctx_shift: a decode that would fill the context first drops half of the positions
        after the first n_keep (shift()). type_k: the K cache's ggml type (F16 1, Q8_0 8, Q4_0 2, ...: make_keys).
        flash_attn: attention as llama.cpp's flash attention (flash_attn.py); type_v: the V cache's ggml type, other
        than F16 only with flash_attn (make_values)."""
        if type_v != 1 and not flash_attn:
            raise UsageError("a quantized V cache needs flash attention")
        cfg = model.config
        self.cfg, self.n_ctx = cfg, n_ctx
        self.ctx_shift, self.n_keep = ctx_shift, n_keep
        self.w = weights or ReferenceWeights(model)
        self.ffn = sparse.SparseFFN(model, self.w.layers, choose_rule(model) if rule is None else rule)
        self.qk = make_keys(type_k, cfg.n_layer, n_ctx, cfg.n_head_kv, cfg.head_dim)
        self.k = None if self.qk else np.zeros((cfg.n_layer, n_ctx, cfg.n_head_kv, cfg.head_dim), F16)
        self.flash = flash_attn
        self.qv = make_values(type_v, cfg.n_layer, n_ctx, cfg.n_head_kv, cfg.head_dim_v)
        self.v = None if self.qv else np.zeros((cfg.n_layer, n_ctx, cfg.n_head_kv, cfg.head_dim_v), F16)
        self.n_past = 0
        self.trace = None   # optional callable(name, layer, array) for checkpoint comparisons

    def reset(self) -> None:
        self.n_past = 0

    def truncate(self, n_keep: int) -> None:
        """Keep the first n_keep cached positions (0 <= n_keep <= n_past) and forget the rest."""
        if not 0 <= n_keep <= self.n_past:
            raise UsageError(f"cannot keep {n_keep} of {self.n_past} cached positions")
        self.n_past = int(n_keep)

    def bench_stats(self) -> dict:
        return self.ffn.stats()

    def _cb(self, name, il, x):
        if self.trace is not None:
            self.trace(name, il, x)

    def decode(self, tokens, all_logits: bool = False) -> np.ndarray:
        """Evaluate `tokens` after the cached ones; return float32 logits of the last token (n_vocab,),
        or of every token (n_tok, n_vocab) when all_logits."""
        cfg, w = self.cfg, self.w
        n = len(tokens)
        if n == 0:
            raise UsageError("nothing to decode")
        if self.ctx_shift and self.n_past + n >= self.n_ctx:     # llama-completion's test, before the decode
            n_discard = (self.n_past - self.n_keep) // 2
            if n_discard > 0 and self.n_past - n_discard + n <= self.n_ctx:
                self.shift(self.n_keep, n_discard)
        if self.n_past + n > self.n_ctx:
            raise UsageError(f"context full: {self.n_past} + {n} tokens > n_ctx {self.n_ctx}")
        pos = np.arange(self.n_past, self.n_past + n)
        x = w.token_embd.rows(np.asarray(tokens))
        if cfg.embd_scale != 1.0:
            x = x * np.float32(cfg.embd_scale)
        for il, L in enumerate(w.layers):
            x = self._layer(il, L, x, pos, n)
        self.n_past += n
        if not all_logits:
            x = x[-1:]
        x = rms_norm(x, w.output_norm, cfg.rms_eps)
        self._cb("result_norm", -1, x)
        logits = w.output(x)
        if cfg.logit_softcap:
            c = np.float32(cfg.logit_softcap)
            logits = np.tanh(logits / c) * c
        self._cb("result_output", -1, logits)
        self.w.model.file.check_io()    # no logits from pages of the file that failed (read as zeros)
        return logits if all_logits else logits[0]

    def shift(self, n_keep: int, n_discard: int) -> None:
        """llama.cpp's context shift (llama_memory_seq_rm + seq_add): positions n_keep .. n_keep+n_discard-1 are
        dropped, the later ones move down by n_discard, their keys rotated by RoPE at position -n_discard (the F16
        values rotated in float, rounded to F16, as ggml_rope_ext on the F16 cache). The cache stays in position
        order (llama.cpp leaves the moved cells in place and fills the freed ones next)."""
        cfg, n_past = self.cfg, self.n_past
        if not (0 <= n_keep and 0 < n_discard <= n_past - n_keep):
            raise UsageError(f"cannot shift the context: keep {n_keep}, discard {n_discard} of {n_past}")
        src, dst = slice(n_keep + n_discard, n_past), slice(n_keep, n_past - n_discard)
        m = n_past - n_keep - n_discard
        for il in range(cfg.n_layer):
            cos, sin = rope_cache(np.array([-n_discard]), cfg.n_rot, cfg.layer_rope_base(il), cfg.rope_freq_scale,
                                  self.w.rope_freqs)
            cs = np.repeat(cos, m, 0), np.repeat(sin, m, 0)
            if self.qk:
                self.qk.shift(il, src, dst, lambda k: rope(k, *cs, cfg.n_rot, cfg.rope_neox))
            else:
                k = self.k[il, src].astype(np.float32)
                self.k[il, dst] = rope(k, *cs, cfg.n_rot, cfg.rope_neox).astype(F16)
            if self.qv:
                self.qv.move(il, src, dst)
            else:
                self.v[il, dst] = self.v[il, src].copy()
        self.n_past = n_past - n_discard

    def _layer(self, il: int, L: dict, x: np.ndarray, pos: np.ndarray, n: int) -> np.ndarray:
        cfg = self.cfg
        h = rms_norm(x, L["attn_norm"], cfg.rms_eps)
        self._cb("attn_norm", il, h)
        note = getattr(self.ffn, "note_attn_input", None)     # a predictor reading the layer's input
        if note is not None:
            note(il, h)
        q, k, v = L["attn_q"](h), L["attn_k"](h), L["attn_v"](h)
        self._cb("Qcur", il, q)
        self._cb("Kcur", il, k)
        self._cb("Vcur", il, v)
        if cfg.qkv_bias:
            q, k, v = q + L["bq"], k + L["bk"], v + L["bv"]
            self._cb("Qcur.bias", il, q)
        q = q.reshape(n, cfg.n_head, cfg.head_dim)
        k = k.reshape(n, cfg.n_head_kv, cfg.head_dim)
        if cfg.qk_norm:
            q, k = rms_norm(q, L["q_norm"], cfg.rms_eps), rms_norm(k, L["k_norm"], cfg.rms_eps)
        cos, sin = rope_cache(pos, cfg.n_rot, cfg.layer_rope_base(il), cfg.rope_freq_scale, self.w.rope_freqs)
        q, k = rope(q, cos, sin, cfg.n_rot, cfg.rope_neox), rope(k, cos, sin, cfg.n_rot, cfg.rope_neox)
        self._cb("Qcur.rope", il, q)
        self._cb("Kcur.rope", il, k)
        if self.qk:
            self.qk.store(il, pos, self.qk.rotate(k))
        else:
            self.k[il, pos] = k.astype(F16)
        v = v.reshape(n, cfg.n_head_kv, cfg.head_dim_v)
        v_rot = 64 if self.qv and cfg.head_dim_v % 64 == 0 else 0     # llama.cpp's attn_rot_v
        if self.qv:
            self.qv.store(il, pos, fwht(v, v_rot) if v_rot else v)
        else:
            self.v[il, pos] = v.astype(F16)
        window = cfg.sliding_window if cfg.is_swa_layer(il) else 0
        scale = cfg.attn_scale
        if cfg.q_prescale:
            q, scale = q * np.float32(scale), 1.0
        kq_fn = None
        if self.qk:
            q, n_kv = self.qk.rotate(q), self.n_past + n
            kq_fn = lambda qh: self.qk.kq(il, qh, n_kv)  # noqa: E731
        if self.flash:
            n_kv = self.n_past + n
            vals = self.qv.values(il, slice(0, n_kv)) if self.qv else self.v[il]
            a = flash_attention(q, None if self.qk else self.k[il], vals, pos, n_kv, scale, window, kq_fn=kq_fn,
                                v_f16=self.qv is None)
            if v_rot:
                a = fwht(a, v_rot)
        else:
            a = attention(q, None if self.qk else self.k[il], self.v[il], pos, self.n_past + n, scale, window,
                          trace=(lambda name, t: self._cb(name, il, t)) if self.trace else None, kq_fn=kq_fn)
        self._cb("kqv_out", il, a)
        a = L["attn_output"](a)
        if cfg.post_norms:
            a = rms_norm(a, L["post_attn"], cfg.rms_eps)
        self._cb("attn_out", il, a)
        x = x + a
        self._cb("ffn_inp", il, x)
        h = rms_norm(x, L["ffn_norm"], cfg.rms_eps)
        self._cb("ffn_norm", il, h)
        f = self.ffn(il, L, h, x, lambda name, t: self._cb(name, il, t))
        if cfg.post_norms:
            f = rms_norm(f, L["post_ffw"], cfg.rms_eps)
        self._cb("ffn_out", il, f)
        x = x + f
        self._cb("l_out", il, x)
        return x
