"""down_qx1.py — the integer group sum of Q4_1 and Q5_1 down rows (`pi2 convert --ffn-type q4_1 | q5_1`), the
reference the C kernels (csrc/kernels/axpy_qx1.c) equal bit for bit.

A row's block b (32 columns) holds unsigned values q (0..15 for Q4_1, 0..31 for Q5_1), a scale d and a minimum
m (fp16), value = d·q + m. Over one group's active neurons i (the groups of csrc/pi2.h, GROUP neurons each,
p_i = h_i) the group's part of block b is computed with 8-bit activations, as the dense kernels multiply
8-bit activations with the rows (PowerInfer's q4_0×q8_0 axpy does the same per neuron):
    a_i = p_i·d_ib (float32);  M_b = ((+0 + p_0·m_0b) + p_1·m_1b) + … (float32, ascending i);
    mx = max_i |a_i|;  blocks with mx outside [1e-30, FLT_MAX] take part_j = M_b;  otherwise
    iS = 127/mx, S = mx/127 (float32);  z_i = round-half-even(a_i·iS)  (|z_i| <= 127);
    acc_j = Σ_i z_i·q_ij (exact int32);  part_j = S·(float32)acc_j + M_b (two rounded float32 operations)
and y = the groups' parts added from +0 in ascending group order, as for the other row types. The only
approximation is z, an 8-bit quantization of the block's a_i against the group's largest (about 0.4 % of it,
like the q8 activations of the dense product); the float sum over rows it replaces cost one product and one
sum per weight.
"""
from __future__ import annotations

import numpy as np

from pi2.reference.quants import Q4_1, Q5_1, _fp16, _nibbles, _with_high_bits

QX1_TYPES = (Q4_1, Q5_1)
_BYTES = {Q4_1: 20, Q5_1: 24}
_F32_MAX = np.finfo(np.float32).max


def _fields(raw: np.ndarray, qtype: int, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """rows (k, row_bytes) uint8 -> q (k, nb, 32) uint8, d (k, nb) and m (k, nb) float32."""
    k, nb = raw.shape[0], n // 32
    blocks = np.ascontiguousarray(raw).reshape(k * nb, _BYTES[qtype])
    d, m = _fp16(blocks[:, 0:2]), _fp16(blocks[:, 2:4])
    q = _nibbles(blocks[:, 4:20]) if qtype == Q4_1 else _with_high_bits(_nibbles(blocks[:, 8:24]), blocks[:, 4:8])
    return q.reshape(k, nb, 32), d.reshape(k, nb), m.reshape(k, nb)


def group_part(p: np.ndarray, raw: np.ndarray, qtype: int, n: int) -> np.ndarray:
    """One group's part (n,) from its float32 p (k,) and its k rows (k, row_bytes) of type qtype."""
    q, d, m = _fields(raw, qtype, n)
    p = np.asarray(p, np.float32)[:, None]
    a = p * d                                                             # (k, nb)
    M = np.add.accumulate(p * m, axis=0)[-1] + np.float32(0)             # ascending i (the +0 start)
    mx = np.abs(a).max(axis=0)
    ok = (mx >= np.float32(1e-30)) & (mx <= _F32_MAX)
    safe = np.where(ok, mx, np.float32(1))
    inv, s = np.float32(127) / safe, safe / np.float32(127)
    z = np.where(ok[None, :], np.rint(a * inv[None, :]), np.float32(0)).astype(np.int64)
    acc = np.einsum("ib,ibj->bj", z, q.astype(np.int64))                # exact; |acc| <= 64·127·31 < 2^31
    part = np.where(ok[:, None], s[:, None] * acc.astype(np.float32) + M[:, None], M[:, None] + np.zeros_like(
        acc, dtype=np.float32))
    return part.reshape(n).astype(np.float32)


def axpy_rows_qx1(h: np.ndarray, raw: np.ndarray, qtype: int, n: int, group: int) -> np.ndarray:
    """y (T, n) = the groups' parts added from +0 in ascending order, for h (T, n_rows) with inactive
    neurons at 0 and the rows raw (n_rows, row_bytes)."""
    y = np.zeros((h.shape[0], n), np.float32)
    for t in range(h.shape[0]):
        nz = np.flatnonzero(h[t])
        if not nz.size:
            continue
        acc = np.zeros(n, np.float32)
        for g in np.unique(nz // group):
            sel = nz[nz // group == g]
            acc = acc + group_part(h[t, sel], raw[sel], qtype, n)
        y[t] = acc
    return y
