"""flash_attn.py — attention with flash attention on (`-fa on`), as llama.cpp 0c1e570's CPU backend computes it
(ggml_compute_forward_flash_attn_ext_f16, x86 AVX-512 build), roundings included.

ggml runs one of two loops, chosen by the batch (the ubatch's token count) and the cache types:
- one row at a time (`ggml_compute_forward_flash_attn_ext_f16_one_chunk`): fewer than 64 tokens, or a quantized K
  or V. Q is converted to K's vec_dot type (F16; Q8_0/Q8_1 for quantized keys), s = (K·q)·scale + mask, masked keys
  skipped; an online softmax over the keys in cache order with libm expf: on a new maximum M the accumulator is
  scaled by ms = expf(Mold − M) and the key gets vs = 1, else vs = expf(s − M); S = S·ms + vs (one FMA). With an F16
  V the accumulator is F16: each step rounds fma(v, vs, acc) (ggml_vec_mad_f16) and acc·ms (ggml_vec_scale_f16) to
  F16; any other V is converted to float and accumulated in F32. The end: acc · (1/S).
- tiled (`ggml_compute_forward_flash_attn_ext_tiled`): 64 tokens or more with F16 K and V. Q stays F32; for each
  tile of 64 cache cells, K·q is an FMA chain over the head dimension (simd_gemm), times scale, plus the mask; the
  tile's maximum updates M (the accumulator and S scaled by libm expf(Mold − M)); the weights are
  ggml_v_expf(s − M), summed as ggml_vec_soft_max_f32 does (four groups of 16, reduce16, into a double, added to
  the float S); the accumulator (F32) takes an FMA chain over the tile's 64 cells. The end: acc · (1/S).
Each query row's numbers depend only on its own keys, so splitting rows over threads changes nothing. (ggml's
third loop, a decode over >= 512 cache cells split across threads, equals the one-row loop with one thread; with
more threads llama.cpp's own figures change, pi2 keeps the one-thread figures.)
Does not: store the cache (forward.py, kv_cache.py), or the FA-off attention (forward.attention).
"""
from __future__ import annotations

import numpy as np

from pi2.reference import ggml_order as go
from pi2.reference.moe_routing import expf

F16, F32, F64 = np.float16, np.float32, np.float64
TILE_Q = 64    # GGML_FA_TILE_Q: batches of at least this many tokens take the tiled loop
TILE_KV = 64   # GGML_FA_TILE_KV


def _masks(pos: np.ndarray, n_kv: int, window: int) -> np.ndarray:
    kpos = np.arange(n_kv)
    masked = kpos[None, :] > pos[:, None]
    if window:
        masked |= (pos[:, None] - kpos[None, :]) >= window
    return masked                                                              # (n_tok, n_kv)


def _expf_where(x: np.ndarray, where: np.ndarray) -> np.ndarray:
    """libm expf of x where `where`, 1 elsewhere (libm is called per element: only where needed)."""
    out = np.ones(x.shape, F32)
    if where.any():
        out[where] = expf(x[where])
    return out


def _one_row(s: np.ndarray, masked: np.ndarray, values: np.ndarray, v_f16: bool) -> np.ndarray:
    """The one-row loop for R rows at once: s (R, n_kv) scaled scores, masked (R, n_kv), values (R, n_kv, dv) float32
    (F16 values when v_f16). Returns (R, dv)."""
    R, n_kv = s.shape
    dv = values.shape[-1]
    acc = np.zeros((R, dv), F32)
    M = np.full(R, -np.inf, F32)
    S = np.zeros(R, F32)
    with np.errstate(invalid="ignore", over="ignore"):
        for j in range(n_kv):
            vis = ~masked[:, j]
            if not vis.any():
                continue
            sj = s[:, j]
            new = vis & (sj > M)
            ms = np.where(new, _expf_where(M - sj, new), F32(1))
            vs = _expf_where(sj - M, vis & ~new)
            scaled = acc * ms[:, None]
            if v_f16:
                scaled = scaled.astype(F16).astype(F32)
            acc = np.where(new[:, None], scaled, acc)
            step = go.fma32(values[:, j], vs[:, None], acc)
            if v_f16:
                step = step.astype(F16).astype(F32)
            acc = np.where(vis[:, None], step, acc)
            S = np.where(vis, go.fma32(S, ms, vs), S)
            M = np.where(new, sj, M)
    inv = np.where(S == 0, F32(0), F32(1) / np.where(S == 0, F32(1), S)).astype(F32)
    return acc * inv[:, None]


def _tiled(q: np.ndarray, k: np.ndarray, masked: np.ndarray, values: np.ndarray, scale: float) -> np.ndarray:
    """The tiled loop for R rows: q (R, hd) float32, k (R, n_kv, hd) and values (R, n_kv, dv) F16-valued float32,
    masked (R, n_kv). Returns (R, dv)."""
    R, n_kv, hd = k.shape
    dv = values.shape[-1]
    acc = np.zeros((R, dv), F32)
    M = np.full(R, -np.inf, F32)
    S = np.zeros(R, F32)
    with np.errstate(invalid="ignore", over="ignore"):
        for ic in range(0, n_kv, TILE_KV):
            n = min(TILE_KV, n_kv - ic)
            kt, vt, mt = k[:, ic:ic + n], values[:, ic:ic + n], masked[:, ic:ic + n]
            s = np.zeros((R, n), F32)
            for d in range(hd):                                 # simd_gemm: an FMA chain over the head dimension
                s = go.fma32(kt[:, :, d], q[:, d:d + 1], s)
            s = (s * F32(scale)).astype(F32)
            s = np.where(mt, F32(-np.inf), s).astype(F32)
            s = go.pad_to(s, TILE_KV) if n < TILE_KV else s
            if n < TILE_KV:
                s[:, n:] = -np.inf
            tmax = s.max(axis=1)
            live = tmax != -np.inf
            Mnew = np.where(live, np.maximum(M, tmax), M)
            grow = live & (Mnew > M)
            ms = _expf_where(M - Mnew, grow)
            acc = np.where(grow[:, None], acc * ms[:, None], acc)
            S = np.where(grow, S * ms, S).astype(F32)
            M = Mnew
            p = go.v_expf(s - M[:, None])                       # (R, 64); masked cells give 0
            p = np.where(live[:, None], p, F32(0))
            groups = go.reduce16(go.lanes(p, 16)).astype(F64)  # (R, 4)
            tsum = np.zeros(R, F64)
            for g in range(groups.shape[1]):
                tsum = tsum + groups[:, g]
            S = np.where(live, (S.astype(F64) + tsum).astype(F32), S)
            for t in range(n):                                  # simd_gemm: an FMA chain over the tile's cells
                acc = go.fma32(vt[:, t], p[:, t:t + 1], acc)
    inv = np.where(S == 0, F32(0), F32(1) / np.where(S == 0, F32(1), S)).astype(F32)
    return acc * inv[:, None]


def flash_attention(q, k_cache, v_values, pos, n_kv, scale, window=0, kq_fn=None, v_f16=True):
    """Causal GQA attention with flash attention on. q (n_tok, n_head, hd) float32; k_cache (n_ctx, n_head_kv, hd)
    float16 (None with kq_fn); v_values (n_ctx, n_head_kv, hd_v): float16 for an F16 V, else the float32 values of a
    quantized V (dequantized: v_f16=False). pos (n_tok,) the queries' positions, keys 0..n_kv-1.
    kq_fn: K·q of quantized keys (kv_cache.QuantKeys.kq: (hkv, m, hd) -> (hkv, m, n_kv)), one row at a time.
    Returns (n_tok, n_head*hd_v)."""
    n_tok, n_head, hd = q.shape
    n_head_kv = v_values.shape[1]
    g = n_head // n_head_kv
    masked = _masks(np.asarray(pos), n_kv, window)                                 # (n_tok, n_kv)
    vals = np.asarray(v_values[:n_kv], F32).transpose(1, 0, 2)                    # (hkv, n_kv, dv)
    qh = np.asarray(q, F32).reshape(n_tok, n_head_kv, g, hd).transpose(1, 2, 0, 3)  # (hkv, g, n_tok, hd)
    rows_mask = np.broadcast_to(masked, (n_head_kv, g, n_tok, n_kv)).reshape(-1, n_kv)
    rows_vals = np.broadcast_to(vals[:, None, None], (n_head_kv, g, n_tok, n_kv, vals.shape[-1]))
    rows_vals = rows_vals.reshape(-1, n_kv, vals.shape[-1])
    if kq_fn is None and v_f16 and n_tok >= TILE_Q:
        k = k_cache[:n_kv].astype(F32).transpose(1, 0, 2)                           # (hkv, n_kv, hd)
        rows_k = np.broadcast_to(k[:, None, None], (n_head_kv, g, n_tok, n_kv, hd)).reshape(-1, n_kv, hd)
        out = _tiled(qh.reshape(-1, hd), rows_k, rows_mask, rows_vals, scale)
    else:
        if kq_fn is None:
            k = k_cache[:n_kv].astype(F32).transpose(1, 0, 2)
            qf = qh.astype(F16).astype(F32).reshape(n_head_kv, g * n_tok, hd)
            kq = go.dot_f16_vec(k, qf)
        else:
            kq = kq_fn(np.ascontiguousarray(qh.reshape(n_head_kv, g * n_tok, hd)))
        s = (kq.reshape(-1, n_kv) * F32(scale)).astype(F32)
        out = _one_row(s, rows_mask, rows_vals, v_f16)
    return out.reshape(n_head_kv, g, n_tok, -1).transpose(2, 0, 1, 3).reshape(n_tok, -1)
