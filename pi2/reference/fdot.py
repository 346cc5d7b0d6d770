# fdot.py — ggml's x86 (AVX-512) products for F32 and F16 weights and for repacked Q4_0, float operation by
# float operation, where qdot.py has the other quantized kernels.
# F32: ggml_vec_dot_f32 (one token, and every mul_mat_id row): four 16-lane FMA accumulators over steps of 64,
#      combined (0+2, 1+3, 0+1), _mm512_reduce_add_ps, a scalar FMA tail; llamafile's tinyBLAS (batches of 2+
#      when k % 16 == 0 and the rows are a multiple of 4): one 16-lane FMA accumulator, _mm512_reduce_add_ps.
# F16: the activation rounded to F16, then ggml_vec_dot_f16 / tinyBLAS<16> on F16 (ggml_order's two orders).
# Q4_0 (repacked q4_0_8x8, ne[1] % 8 == 0): GEMV and GEMM alike, acc = fma(float(Σ_block q_w·q_x), d_w·d_x, acc)
#      over the 32-value blocks, the activation quantized to Q8_0.
# FMAs are emulated in float64 (an f32·f32 product is exact there), as in ggml_order.py.
from __future__ import annotations

import numpy as np

from pi2.reference import ggml_order as go
from pi2.reference.quants import Q8_0, quantize_act

F32, F64 = np.float32, np.float64
_ROWS = 256                      # output rows per step: bounds the float64 lane temporaries


def _chunks(n_out: int):
    for r0 in range(0, n_out, _ROWS):
        yield r0, min(n_out, r0 + _ROWS)


def tinyblas_ok(n_tok: int, n_out: int, k: int) -> bool:
    """llamafile_sgemm takes F32/F16 products of 2+ tokens when k % 16 == 0 and m % 4 == 0 (AVX-512)."""
    return n_tok >= 2 and k % 16 == 0 and n_out % 4 == 0


def dot_f32_tinyblas(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """tinyBLAS<16, __m512> on F32: lane l of (token, row) accumulates w[16s+l]·x[16s+l] by FMA over s, then
    _mm512_reduce_add_ps (ggml_order.reduce16). w (n_out, k), x (T, k) -> (T, n_out)."""
    n_tok, k = x.shape
    out = np.empty((n_tok, w.shape[0]), F32)
    xl = go.lanes(x, 16)                                          # (16, T, k/16)
    for r0, r1 in _chunks(w.shape[0]):
        wl = go.lanes(w[r0:r1], 16)                              # (16, R, k/16)
        acc = np.zeros((16, n_tok, r1 - r0), F32)
        for s in range(k // 16):
            acc = (xl[:, :, None, s].astype(F64) * wl[:, None, :, s] + acc).astype(F32)
        out[:, r0:r1] = go.reduce16(acc)
    return out


def dot_f32_vec(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """ggml_vec_dot_f32 (AVX-512) for every (token, row): accumulator j (16 lanes) takes values
    64i + 16j + l by FMA; then (acc0+acc2) + (acc1+acc3), _mm512_reduce_add_ps, and the k % 64 tail values
    added by scalar FMA in order. w (n_out, k), x (T, k) -> (T, n_out)."""
    n_tok, k = x.shape
    kk = k - k % 64
    out = np.empty((n_tok, w.shape[0]), F32)
    for r0, r1 in _chunks(w.shape[0]):
        ws = w[r0:r1]
        acc = np.zeros((4, 16, n_tok, r1 - r0), F32)
        for i in range(0, kk, 64):
            for j in range(4):
                sl = slice(i + 16 * j, i + 16 * j + 16)
                p = x[:, sl].T[:, :, None].astype(F64) * ws[:, sl].T[:, None, :]      # (16, T, R)
                acc[j] = (p + acc[j]).astype(F32)
        s = go.reduce16((acc[0] + acc[2]) + (acc[1] + acc[3])) if kk else np.zeros((n_tok, r1 - r0), F32)
        for i in range(kk, k):
            s = (x[:, i, None].astype(F64) * ws[None, :, i] + s).astype(F32)
        out[:, r0:r1] = s
    return out


def dot_f16_vec(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """F16 weights (as float32 values), one token: the activation rounded to F16, ggml_vec_dot_f16."""
    xh = x.astype(np.float16).astype(F32)
    return go.dot_f16_vec(w, xh)


def dot_f16_tinyblas(w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """F16 weights, a batch: the activation rounded to F16, tinyBLAS<16> on F16."""
    xh = x.astype(np.float16).astype(F32)
    out = np.empty((x.shape[0], w.shape[0]), F32)
    for r0, r1 in _chunks(w.shape[0]):
        out[:, r0:r1] = go.dot_f16_tinyblas(w[r0:r1], xh)
    return out


def q4_0_blocks(raw: np.ndarray, n_in: int) -> tuple[np.ndarray, np.ndarray]:
    """Q4_0 rows (n_out, row_bytes) -> (q int8 (nb, 32, n_out) = nibble − 8 in value order, d float32 (nb, n_out))."""
    n_out = raw.shape[0]
    b = np.ascontiguousarray(raw).reshape(-1, 18)
    qs = b[:, 2:18]
    q = np.concatenate([qs & 0xF, qs >> 4], axis=1).astype(np.int8) - np.int8(8)
    d = b[:, 0:2].copy().view(np.float16).astype(F32).reshape(n_out, -1)
    return np.ascontiguousarray(q.reshape(n_out, -1, 32).transpose(1, 2, 0)), np.ascontiguousarray(d.T)


def dot_q4_0_repack(q: np.ndarray, d: np.ndarray, x: np.ndarray) -> np.ndarray:
    """ggml_gemv/gemm_q4_0_8x8_q8_0 (AVX2/AVX-512): per output, acc = fma(float(Σ q_w·q_x over the block),
    d_w·d_x, acc) block by block. q (nb, 32, n_out), d (nb, n_out), x (T, k) float32 -> (T, n_out)."""
    dy, qy = quantize_act(x, Q8_0)
    dy = dy.astype(F32)
    n_tok, nb = qy.shape[0], qy.shape[1]
    acc = np.zeros((n_tok, q.shape[2]), F32)
    for b in range(nb):
        isum = qy[:, b].astype(F32) @ q[b].astype(F32)              # exact integers (|Σ| < 2^24)
        scale = (d[b][None, :] * dy[:, b, None]).astype(F32)
        acc = (isum.astype(F64) * scale + acc).astype(F32)
    return acc
