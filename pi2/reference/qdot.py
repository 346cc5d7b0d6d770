# qdot.py — llama.cpp's x86 quantized matrix products, float operation by float operation: the integer
# dot products of each SIMD lane, the per-block FMA accumulation, the horizontal sums and the scalar terms,
# in the order the kernel this build runs for the weight type and batch size (vec_dot for one token,
# llamafile tinyBLAS or repacked GEMM for batches). Vectorised over tokens, rows and lanes; loops over blocks.
# Used by quants.QuantLinear; weights arrive as integer blocks and float32 scales (Weights below).
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pi2.reference.ggml_order import hsum8

F32, F64 = np.float32, np.float64
_CHUNK_BYTES = 3 << 20          # float64 lane accumulators per row chunk: fits in L2


@dataclass
class Weights:
    """A quantized matrix as the kernels read it: q (nb, bs, n_out) small integers (int8/uint8), one scale per
    block d (nb, n_out) and, for Q4_1, the block minimum m (nb, n_out); Q6_K: unsigned codes (nb, 256, n_out)
    and int8 scales sc (nb, 16, n_out)."""
    q: np.ndarray
    d: np.ndarray
    m: np.ndarray | None = None
    sc: np.ndarray | None = None     # K-quants: sub-block scales (nb, n_sub, n_out)
    mn: np.ndarray | None = None     # Q4_K: sub-block mins (nb, 8, n_out); m then holds dmin


def _row_chunks(n_tok: int, n_out: int, lanes: int):
    step = max(16, _CHUNK_BYTES // (8 * lanes * max(n_tok, 1)))
    for r0 in range(0, n_out, step):
        yield r0, min(n_out, r0 + step)


def lane_fma(qy: np.ndarray, dy: np.ndarray, w: Weights, r0: int, r1: int, n_lanes: int) -> np.ndarray:
    """acc (n_lanes, n_tok, rows) after `acc = fma(d_x·d_y, Σ_lane q_x·q_y, acc)` over the blocks, lane l
    holding values [l·g, (l+1)·g) of each block (g = block size / n_lanes): the AVX2/VNNI vec_dot shape."""
    n_tok, nb, bs = qy.shape
    g = bs // n_lanes
    rows = r1 - r0
    acc = np.zeros((n_lanes, n_tok, rows), F32)
    tmp = np.empty((n_lanes, n_tok, rows), F64)
    for b in range(nb):
        ya = qy[:, b].reshape(n_tok, n_lanes, g).transpose(1, 0, 2)            # (L, T, g)
        xa = w.q[b, :, r0:r1].astype(F32).reshape(n_lanes, g, rows)                      # (L, g, R)
        xy = np.matmul(ya, xa)                                                 # exact integers
        dd = (dy[:, b, None] * w.d[b, None, r0:r1]).astype(F64)                # float32 product d_x·d_y
        np.multiply(xy, dd, out=tmp)
        tmp += acc
        acc[...] = tmp
    return acc


def fma_chain(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Σ_b a[:, b]·b[b, :] as a scalar loop `s = fma(a, b, s)` (GCC contracts `s += a*b`): (T, nb) x (nb, R)."""
    s = np.zeros((a.shape[0], b.shape[1]), F32)
    for i in range(a.shape[1]):
        s = (a[:, i, None].astype(F64) * b[None, i] + s).astype(F32)
    return s


def dot_q4_1_q8_1(w: Weights, act: tuple) -> np.ndarray:
    """ggml_vec_dot_q4_1_q8_1 and _q5_1_q8_1 (AVX2 with VNNI dpbusd; llama.cpp has no batch kernel for either on
    x86, so every token): 8 lanes of 4 byte products per block (unsigned 4- or 5-bit codes in value order),
    fmadd with d_x·d_y, hsum_float_8, plus summs = fma chain of m_x·s_y (the fp16 products are exact, so fused or
    not alike). act = quantize_act(x, Q8_1), rows (T, n)."""
    d, s, q = act
    dy, sy, qy = d.astype(F32), s.astype(F32), q.astype(F32)
    n_tok, n_out = qy.shape[0], w.q.shape[2]
    out = np.empty((n_tok, n_out), F32)
    for r0, r1 in _row_chunks(n_tok, n_out, 8):
        acc = lane_fma(qy, dy, w, r0, r1, 8)
        out[:, r0:r1] = hsum8(acc) + fma_chain(sy, w.m[:, r0:r1])
    return out


def dot_q8_lanes(w: Weights, act: tuple) -> np.ndarray:
    """ggml_vec_dot_q5_0_q8_0 / _q8_0_q8_0 (AVX2, one token) and llamafile's tinyBLAS_Q0_AVX (batches), which
    compute alike: 8 lanes of 4 signed byte products per block, acc = fma(d_x·d_y, lane, acc), hsum_float_8."""
    d, q = act
    dy, qy = d.astype(F32), q.astype(F32)
    n_tok, n_out = qy.shape[0], w.q.shape[2]
    out = np.empty((n_tok, n_out), F32)
    for r0, r1 in _row_chunks(n_tok, n_out, 8):
        out[:, r0:r1] = hsum8(lane_fma(qy, dy, w, r0, r1, 8))
    return out


# ---------------------------------------------------------------- Q6_K × Q8_K

def _q6_scaled(w: Weights, b: int, r0: int, r1: int, bias: int) -> np.ndarray:
    """(256, rows) float64: sub-block scale × (code − bias) of block b, exact integers."""
    sc = np.repeat(w.sc[b, :, r0:r1].astype(F64), 16, axis=0)
    return sc * (w.q[b, :, r0:r1].astype(F64) - bias)


def dot_q6_k_tiled(w: Weights, act: tuple) -> np.ndarray:
    """ggml's tiled K-quant matmul (AVX-512 VNNI microkernel), batches of 8+ tokens: per 256-block the exact
    integer Σ scale·(code − 32)·q8 is converted to float, times d_x, then acc = fma(that, d_y, acc)."""
    dy, qy, _ = act
    n_tok, nb, n_out = qy.shape[0], qy.shape[1], w.q.shape[2]
    acc = np.zeros((n_tok, n_out), F32)
    for b in range(nb):
        s1 = (qy[:, b].astype(F64) @ _q6_scaled(w, b, 0, n_out, 32)).astype(F32)
        res = (s1 * w.d[b][None, :]).astype(F32)
        acc = (res.astype(F64) * dy[:, b, None] + acc).astype(F32)
    return acc


def dot_q6_k_vec(w: Weights, act: tuple) -> np.ndarray:
    """ggml_vec_dot_q6_K_q8_K (AVX2), fewer than 8 tokens: int32 lane m sums scale·code·q8 over values whose
    index mod 32 is in [4m, 4m+4), minus 32·(bsums·scales) of 32-value chunk m; converted to float,
    acc = fma(d_y·d_x, lane, acc) per block, then hsum_float_8."""
    dy, qy, bsums = act
    n_tok, nb, n_out = qy.shape[0], qy.shape[1], w.q.shape[2]
    acc = np.zeros((8, n_tok, n_out), F32)
    for b in range(nb):
        ws = _q6_scaled(w, b, 0, n_out, 0).reshape(8, 8, 4, n_out).transpose(1, 0, 2, 3).reshape(8, 32, n_out)
        ya = qy[:, b].astype(F64).reshape(n_tok, 8, 8, 4).transpose(2, 0, 1, 3).reshape(8, n_tok, 32)
        lane = ya @ ws                                                         # (8, T, R)
        bs = bsums[:, b].astype(F64).reshape(n_tok, 8, 2)                      # chunk m = sub-blocks 2m, 2m+1
        sc = w.sc[b].astype(F64).reshape(8, 2, n_out)
        corr = 32 * np.einsum("tmk,mkr->mtr", bs, sc)
        lane = (lane - corr).astype(F32)
        dd = (dy[:, b, None] * w.d[b][None, :]).astype(F64)
        acc = (lane * dd + acc).astype(F32)
    return hsum8(acc)


def dot_q6_k_q8_k(w: Weights, act: tuple) -> np.ndarray:
    """Q6_K weights: the tiled kernel from 8 tokens on (ggml_tiled_min_batch), vec_dot below."""
    return dot_q6_k_tiled(w, act) if act[1].shape[0] >= 8 else dot_q6_k_vec(w, act)


# ---------------------------------------------------------------- Q4_K × Q8_K (CPU_REPACK q4_K_8x8)

def _fma(a, b, c):
    return (a.astype(F64) * b + c).astype(F32)


def dot_q4_k_repack(w: Weights, act: tuple, gemv_only: bool = False) -> np.ndarray:
    """ggml_gemm/gemv_q4_K_8x8_q8_K (Q4_K weights are repacked on AVX2 machines). Tokens in groups of four go
    through the GEMM, which converts Σ scale·Σ code·q8 of each 64-value pair of sub-blocks to float and
    FMAs it with d_x·d_y (and the mins term likewise with dmin_x·d_y); the last T mod 4 tokens go through
    the GEMV, which does the same once per 256-block. Result = acc − acc_min. gemv_only: every token through
    the GEMV (the repacked mul_mat_id)."""
    dy, qy, bsums = act
    n_tok, nb, n_out = qy.shape[0], qy.shape[1], w.q.shape[2]
    n_gemm = 0 if gemv_only else n_tok - n_tok % 4
    acc = np.zeros((n_tok, n_out), F32)
    accm = np.zeros((n_tok, n_out), F32)
    for b in range(nb):
        ya = qy[:, b].astype(F32).reshape(n_tok, 8, 32).transpose(1, 0, 2)               # (8, T, 32)
        p = np.matmul(ya, w.q[b].astype(F32).reshape(8, 32, n_out)).astype(F64)         # (8, T, R) exact
        isub = p * w.sc[b][:, None, :]                                                  # scale · Σ code·q8
        bs32 = bsums[:, b].astype(F64).reshape(n_tok, 8, 2).sum(axis=-1).T              # (8, T)
        msub = bs32[:, :, None] * w.mn[b][:, None, :]
        isb = isub.reshape(4, 2, n_tok, n_out).sum(axis=1)                              # (4, T, R)
        msb = msub.reshape(4, 2, n_tok, n_out).sum(axis=1)
        dd = (dy[:, b, None] * w.d[b][None, :]).astype(F32)
        dm = (dy[:, b, None] * w.m[b][None, :]).astype(F32)
        g = slice(0, n_gemm)
        for k in range(4):                                                              # GEMM rows
            acc[g] = _fma(isb[k, g].astype(F32), dd[g], acc[g])
            accm[g] = _fma(msb[k, g].astype(F32), dm[g], accm[g])
        v = slice(n_gemm, n_tok)                                                        # GEMV rows
        acc[v] = _fma(isb[:, v].sum(axis=0).astype(F32), dd[v], acc[v])
        accm[v] = _fma(msb[:, v].sum(axis=0).astype(F32), dm[v], accm[v])
    return acc - accm


# ---------------------------------------------------------------- Q5_K × Q8_K

def _k5_ints(w: Weights, qy: np.ndarray, b: int):
    """Per 32-value sub-block s: the exact Σ code·q8 (8, T, R) of block b, as float64."""
    n_tok = qy.shape[0]
    ya = qy[:, b].astype(F64).reshape(n_tok, 8, 32).transpose(1, 0, 2)                     # (8, T, 32)
    return np.matmul(ya, w.q[b].astype(F64).reshape(8, 32, -1))                            # (8, T, R)


def dot_q5_k_vec(w: Weights, act: tuple) -> np.ndarray:
    """ggml_vec_dot_q5_K_q8_K (AVX2), fewer than 8 tokens: int32 lane l sums scale_s·Σ code·q8 over the values
    4l..4l+3 of every 32-value sub-block s; per block acc = fma(d_y·d_x, float(lane), acc); the mins term
    summs = fma(−d_y·dmin_x, Σ_s min_s·(bsums[2s] + bsums[2s+1]), summs); result hsum_float_8(acc) + summs."""
    dy, qy, bsums = act
    n_tok, nb, n_out = qy.shape[0], qy.shape[1], w.q.shape[2]
    acc = np.zeros((8, n_tok, n_out), F32)
    summs = np.zeros((n_tok, n_out), F32)
    for b in range(nb):
        ya = qy[:, b].astype(F64).reshape(n_tok, 8, 8, 4).transpose(2, 1, 0, 3)           # (lane, s, T, 4)
        qa = w.q[b].astype(F64).reshape(8, 8, 4, n_out).transpose(1, 0, 2, 3)             # (lane, s, 4, R)
        lane = (np.matmul(ya, qa) * w.sc[b].astype(F64)[None, :, None, :]).sum(axis=1)    # exact integers
        d = (dy[:, b, None] * w.d[b][None, :]).astype(F32)
        acc = (lane.astype(F32).astype(F64) * d + acc).astype(F32)
        bs = bsums[:, b].astype(F64).reshape(n_tok, 8, 2).sum(axis=-1)                    # (T, 8)
        hs = bs @ w.mn[b].astype(F64)                                                      # (T, R) exact
        dmin = ((-dy[:, b, None]) * w.m[b][None, :]).astype(F32)
        summs = (dmin.astype(F64) * hs.astype(F32) + summs).astype(F32)
    return hsum8(acc) + summs


def dot_q5_k_tiled(w: Weights, act: tuple) -> np.ndarray:
    """ggml's tiled K-quant kernel with mins (AVX-512 VNNI), 8+ tokens: per 256-block s1 = Σ_s scale_s·Σ code·q8
    and s2 = Σ_s min_s·bsum_s (int32), result = fma(−dmin_x, float(s2), float(s1)·d_x), acc = fma(result, d_y, acc)."""
    dy, qy, bsums = act
    n_tok, nb, n_out = qy.shape[0], qy.shape[1], w.q.shape[2]
    acc = np.zeros((n_tok, n_out), F32)
    for b in range(nb):
        s1 = (_k5_ints(w, qy, b) * w.sc[b].astype(F64)[:, None, :]).sum(axis=0)
        bs = bsums[:, b].astype(F64).reshape(n_tok, 8, 2).sum(axis=-1)
        s2 = bs @ w.mn[b].astype(F64)
        f1d = (s1.astype(F32) * w.d[b][None, :]).astype(F32)
        res = ((-w.m[b][None, :]).astype(F64) * s2.astype(F32) + f1d).astype(F32)
        acc = (res.astype(F64) * dy[:, b, None] + acc).astype(F32)
    return acc


def dot_q5_k_q8_k(w: Weights, act: tuple) -> np.ndarray:
    """Q5_K weights: the tiled kernel from 8 tokens on, vec_dot below."""
    return dot_q5_k_tiled(w, act) if act[1].shape[0] >= 8 else dot_q5_k_vec(w, act)
