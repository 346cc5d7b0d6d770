"""kquant.py — Q4_K, Q5_K and Q6_K quantizers that produce the bytes llama-quantize writes (no importance matrix).

llama-quantize calls quantize_row_q4_K_ref / quantize_row_q6_K_ref, which live in libggml-base, built without
-march flags: plain float32 operations in source order, no fused multiply-adds, sums accumulated one value at a
time. Both are written here for many sub-blocks at once (numpy over sub-blocks, a Python loop over the values
of a sub-block where the C code sums), so each sum sees its terms in the C order.
Does: quantize_q4_k, quantize_q5_k, quantize_q6_k (float32 rows -> uint8 rows of blocks). Does not: decode (quants_k.py).
"""
from __future__ import annotations

import numpy as np

F32 = np.float32
QK_K = 256
_EPS = F32(1e-15)                       # GROUP_MAX_EPS


def _nearest(v: np.ndarray) -> np.ndarray:
    """nearest_int: round half to even through the 1.5·2^23 trick (|v| < 2^22)."""
    return np.rint(np.asarray(v, F32)).astype(np.int32)


def _seqsum(a: np.ndarray) -> np.ndarray:
    """Σ over the last axis one value at a time in float32 (a C loop `s += a[i]`): np.cumsum is sequential."""
    return np.cumsum(np.asarray(a, F32), axis=-1, dtype=F32)[..., -1]


def _fp16(v: np.ndarray) -> np.ndarray:
    return np.asarray(v, F32).astype(np.float16)


def _make_qkx2(x: np.ndarray, w: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int):
    """make_qkx2_quants (use_mad false) on rows of x (S, n) with weights w: (scale (S,), the_min (S,), L (S, n))."""
    S, n = x.shape
    mn, mx = x.min(axis=1), x.max(axis=1)
    sum_w = _seqsum(w)
    sum_x = _seqsum((w * x).astype(F32))
    mn = np.where(mn > 0, F32(0), mn).astype(F32)
    flat = mx == mn
    rng = np.where(flat, F32(1), (mx - mn).astype(F32))
    nm = F32(nmax)
    iscale = (nm / rng).astype(F32)
    scale = (F32(1) / iscale).astype(F32)
    L = np.clip(_nearest(iscale[:, None] * (x - mn[:, None])), 0, nmax)
    diff = ((scale[:, None] * L.astype(F32)).astype(F32) + mn[:, None]).astype(F32) - x
    best = _seqsum((w * (diff * diff).astype(F32)).astype(F32))
    for step in range(nstep + 1):          # min (mn) moves when a step wins: later steps use the new one
        rng = np.where(flat, F32(1), (mx - mn).astype(F32))
        isc = (((F32(rmin) + (F32(rdelta) * F32(step)).astype(F32)).astype(F32) + nm).astype(F32) / rng).astype(F32)
        la = np.clip(_nearest(isc[:, None] * (x - mn[:, None])), 0, nmax)
        lf = la.astype(F32)
        wl = (w * lf).astype(F32)
        s_l, s_l2, s_xl = _seqsum(wl), _seqsum((wl * lf).astype(F32)), _seqsum((wl * x).astype(F32))
        D = ((sum_w * s_l2).astype(F32) - (s_l * s_l).astype(F32)).astype(F32)
        ok = D > 0
        Dz = np.where(ok, D, F32(1))
        t_scale = (((sum_w * s_xl).astype(F32) - (sum_x * s_l).astype(F32)).astype(F32) / Dz).astype(F32)
        t_min = (((s_l2 * sum_x).astype(F32) - (s_l * s_xl).astype(F32)).astype(F32) / Dz).astype(F32)
        pos = t_min > 0
        t_scale = np.where(pos, (s_xl / np.where(s_l2 == 0, F32(1), s_l2)).astype(F32), t_scale)
        t_min = np.where(pos, F32(0), t_min)
        diff = ((t_scale[:, None] * lf).astype(F32) + t_min[:, None]).astype(F32) - x
        err = _seqsum((w * (diff * diff).astype(F32)).astype(F32))
        take = ok & (err < best) & ~flat
        L = np.where(take[:, None], la, L)
        best = np.where(take, err, best)
        scale = np.where(take, t_scale, scale)
        mn = np.where(take, t_min, mn)
    scale = np.where(flat, F32(0), scale)
    L = np.where(flat[:, None], 0, L)
    return scale.astype(F32), (-mn).astype(F32), L


def _quantize_k4(x: np.ndarray, nmax: int, rmin: float, nstep: int):
    """The part quantize_row_q4_K_ref and _q5_K_ref share: -> (header bytes (B, 16): d, dmin, packed scales and
    mins; codes L (B, 8, 32) in 0..nmax)."""
    xb = x.reshape(-1, 8, 32)                                     # (B, sub-block, value)
    B = xb.shape[0]
    sub = xb.reshape(-1, 32)
    s2 = _seqsum((sub * sub).astype(F32))
    av = np.sqrt((s2 / F32(32)).astype(F32)).astype(F32)
    w = (av[:, None] + np.abs(sub)).astype(F32)
    scales, mins, L = _make_qkx2(sub, w, nmax, rmin, 0.1, nstep)
    scales, mins, L = scales.reshape(B, 8), mins.reshape(B, 8), L.reshape(B, 8, 32)
    max_scale = np.zeros(B, F32)
    max_min = np.zeros(B, F32)
    for j in range(8):
        max_scale = np.where(scales[:, j] > max_scale, scales[:, j], max_scale)
        max_min = np.where(mins[:, j] > max_min, mins[:, j], max_min)
    inv_s = np.where(max_scale > 0, F32(63) / np.where(max_scale > 0, max_scale, F32(1)), F32(0)).astype(F32)
    inv_m = np.where(max_min > 0, F32(63) / np.where(max_min > 0, max_min, F32(1)), F32(0)).astype(F32)
    ls = np.minimum(_nearest(inv_s[:, None] * scales) & 0xFF, 63).astype(np.uint8)
    lm = np.minimum(_nearest(inv_m[:, None] * mins) & 0xFF, 63).astype(np.uint8)
    packed = np.zeros((B, 12), np.uint8)
    packed[:, 0:4], packed[:, 4:8] = ls[:, :4], lm[:, :4]
    packed[:, 8:12] = (ls[:, 4:] & 0xF) | ((lm[:, 4:] & 0xF) << 4)
    packed[:, 0:4] |= (ls[:, 4:] >> 4) << 6
    packed[:, 4:8] |= (lm[:, 4:] >> 4) << 6
    d = _fp16((max_scale / F32(63)).astype(F32))
    dmin = _fp16((max_min / F32(63)).astype(F32))
    dj = (d.astype(F32)[:, None] * ls.astype(F32)).astype(F32)           # get_scale_min_k4 gives back ls, lm
    dm = (dmin.astype(F32)[:, None] * lm.astype(F32)).astype(F32)
    nz = dj != 0
    q = _nearest(((xb + dm[:, :, None]).astype(F32) / np.where(nz, dj, F32(1))[:, :, None]).astype(F32))
    L = np.where(nz[:, :, None], np.clip(q, 0, nmax), L).astype(np.uint8)      # d == 0 keeps make_qkx2's L
    head = np.concatenate([d.view(np.uint8).reshape(B, 2), dmin.view(np.uint8).reshape(B, 2), packed], axis=1)
    return head, L


def quantize_q4_k(x: np.ndarray) -> np.ndarray:
    """quantize_row_q4_K_ref over rows of float32 x (rows, n), n % 256 == 0 -> uint8 (rows, n/256·144)."""
    x = np.ascontiguousarray(x, F32)
    head, L = _quantize_k4(x, 15, -1.0, 20)
    Lf = L.reshape(-1, 4, 2, 32)
    qs = (Lf[:, :, 0] | (Lf[:, :, 1] << 4)).reshape(-1, 128)
    return np.concatenate([head, qs], axis=1).reshape(x.shape[0], -1)


def quantize_q5_k(x: np.ndarray) -> np.ndarray:
    """quantize_row_q5_K_ref over rows of float32 x (rows, n), n % 256 == 0 -> uint8 (rows, n/256·176):
    as Q4_K with 5-bit codes (make_qkx2_quants nmax 31, rmin −0.5, 15 steps), the 5th bits in qh."""
    x = np.ascontiguousarray(x, F32)
    head, L = _quantize_k4(x, 31, -0.5, 15)
    qh = np.zeros((L.shape[0], 32), np.uint8)
    for s in range(8):                                           # bit s of qh[l]: value l of sub-block s
        qh |= ((L[:, s] >> 4) & 1) << s
    Lf = (L & 0xF).reshape(-1, 4, 2, 32)
    qs = (Lf[:, :, 0] | (Lf[:, :, 1] << 4)).reshape(-1, 128)
    return np.concatenate([head, qh, qs], axis=1).reshape(x.shape[0], -1)


def _make_qx(x: np.ndarray, nmax: int):
    """make_qx_quants(n, nmax, x, L, rmse_type=1, NULL) on rows of x (S, n): (scale (S,), L (S, n) in 0..2nmax-1)."""
    S, n = x.shape
    ax = np.abs(x)
    imax = np.argmax(ax, axis=1)                          # the first of the largest |x|
    amax = ax[np.arange(S), imax]
    mx = x[np.arange(S), imax]
    zero = amax < _EPS
    mxz = np.where(zero, F32(1), mx)
    nm = F32(nmax)

    def sums(isc):
        l = np.clip(_nearest(isc[:, None] * x), -nmax, nmax - 1)
        lf = l.astype(F32)
        wgt = (x * x).astype(F32)
        return l, _seqsum(((wgt * x).astype(F32) * lf).astype(F32)), _seqsum(((wgt * lf).astype(F32) * lf).astype(F32))

    isc = (F32(-nmax) / mxz).astype(F32)
    l, slx, sl2 = sums(isc)
    L = l + nmax
    scale = np.where(sl2 != 0, (slx / np.where(sl2 != 0, sl2, F32(1))).astype(F32), F32(0)).astype(F32)
    best = (scale * slx).astype(F32)
    for step in range(-9, 10):
        if step == 0:
            continue
        isc = (-(nm + (F32(0.1) * F32(step)).astype(F32)).astype(F32) / mxz).astype(F32)
        l, slx, sl2 = sums(isc)
        take = (sl2 > 0) & ((slx * slx).astype(F32) > (best * sl2).astype(F32))
        L = np.where(take[:, None], l + nmax, L)
        scale = np.where(take, (slx / np.where(sl2 > 0, sl2, F32(1))).astype(F32), scale)
        best = np.where(take, (scale * slx).astype(F32), best)
    return np.where(zero, F32(0), scale).astype(F32), np.where(zero[:, None], 0, L)


def quantize_q6_k(x: np.ndarray) -> np.ndarray:
    """quantize_row_q6_K_ref over rows of float32 x (rows, n), n % 256 == 0 -> uint8 (rows, n/256·210)."""
    x = np.ascontiguousarray(x, F32)
    rows = x.shape[0]
    xb = x.reshape(-1, 16, 16)
    B = xb.shape[0]
    scales, L = _make_qx(xb.reshape(-1, 16), 32)
    scales, L = scales.reshape(B, 16), L.reshape(B, 16, 16)
    max_scale = np.zeros(B, F32)
    max_abs = np.zeros(B, F32)
    for j in range(16):
        a = np.abs(scales[:, j])
        big = a > max_abs
        max_abs = np.where(big, a, max_abs)
        max_scale = np.where(big, scales[:, j], max_scale)
    zero = max_abs < _EPS
    isc = (F32(-128) / np.where(zero, F32(1), max_scale)).astype(F32)
    d = _fp16((F32(1) / isc).astype(F32))
    sc = np.minimum(_nearest(isc[:, None] * scales), 127).astype(np.int8)
    dj = (d.astype(F32)[:, None] * sc.astype(F32)).astype(F32)
    nz = dj != 0
    q = np.clip(_nearest((xb / np.where(nz, dj, F32(1))[:, :, None]).astype(F32)), -32, 31) + 32
    L = np.where(nz[:, :, None], q, L).astype(np.uint8).reshape(B, 2, 4, 32)      # [half, quarter, l]
    ql = np.empty((B, 2, 2, 32), np.uint8)
    ql[:, :, 0] = (L[:, :, 0] & 0xF) | ((L[:, :, 2] & 0xF) << 4)
    ql[:, :, 1] = (L[:, :, 1] & 0xF) | ((L[:, :, 3] & 0xF) << 4)
    qh = (L[:, :, 0] >> 4) | ((L[:, :, 1] >> 4) << 2) | ((L[:, :, 2] >> 4) << 4) | ((L[:, :, 3] >> 4) << 6)
    out = np.concatenate([ql.reshape(B, 128), qh.reshape(B, 64), sc.view(np.uint8), d.view(np.uint8).reshape(B, 2)],
                         axis=1)
    out[zero] = 0
    return out.reshape(rows, -1)
