# qdot.py — llama.cpp's x86 quantized matrix products, float operation by float operation: the integer
# dot products of each SIMD lane, the per-block FMA accumulation, the horizontal sums and the scalar terms,
# in the order the kernel this build runs for the weight type and batch size (vec_dot for one token,
# llamafile tinyBLAS or repacked GEMM for batches). Vectorised over tokens, rows and lanes; loops over blocks.
# Used by quants.QuantLinear; weights arrive as integer blocks and float32 scales (Weights below).
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pi2.ggml_order import hsum8

F32, F64 = np.float32, np.float64
_CHUNK_BYTES = 3 << 20          # float64 lane accumulators per row chunk: fits in L2


@dataclass
class Weights:
    """A quantized matrix as the kernels read it: q (nb, bs, n_out) small integers (int8/uint8), one scale per
    block d (nb, n_out) and, for Q4_1, the block minimum m (nb, n_out)."""
    q: np.ndarray
    d: np.ndarray
    m: np.ndarray | None = None


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
    """ggml_vec_dot_q4_1_q8_1 (AVX2 with VNNI dpbusd): 8 lanes of 4 byte products per block, fmadd with
    d_x·d_y, hsum_float_8, plus summs = fma chain of m_x·s_y. act = quantize_act(x, Q8_1), rows (T, n)."""
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
