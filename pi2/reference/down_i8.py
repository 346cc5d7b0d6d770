"""down_i8.py — int8 down rows (`pi2 convert --ffn-type i8`) and their integer group sum, the reference the
C kernels (csrc/kernels/axpy_i8.c) equal bit for bit.

A layer's rows are int8 q (n_ff, n_embd), |q| <= 127, with one float32 scale r per row (tensor
blk.L.ffn_down_scale) and one c per column (blk.L.ffn_down_colscale); row i's values are c_j·r_i·q_ij.
The column scales even out the columns before the rows are quantized (c = sqrt(rms·max) of each column:
per-row int8 alone cost SmolLM2 +2.7 % perplexity; with them the FFN output error is within 1.4x Q8_0's).
The FFN output over a group's active neurons (the
groups of csrc/pi2.h, GROUP neurons each) is computed in integers:
    p_i = h_i·r_i (float32);  m = max |p_i|;  groups with m outside [1e-30, FLT_MAX] add nothing;
    iS = 32767/m, S = m/32767 (float32);  z_i = round-half-even(p_i·iS)  (|z_i| <= 32767);
    acc_j = Σ_i z_i·q_ij (exact, |acc_j| < 2^31);  part_j = S·(float32)acc_j (rounded to nearest even,
    then one float32 product)
and y = the groups' parts added from +0 in ascending group order, as for the float row types, then
y_j = y_j·c_j (float32). The only
approximation is z, a 16-bit quantization of the group's p (about 1e-5 relative, far below the int8 rows'
own error); the kernels sum two rows per int16 multiply-add instruction (madd, vpdpwssd) or widen rows to
int16 (NEON smlal).
"""
from __future__ import annotations

import numpy as np


class I8Rows:
    """One layer's int8 down rows and their scales, with QuantLinear's n_in/n_out/raw for byte counts."""

    def __init__(self, q: np.ndarray, scale: np.ndarray, colscale: np.ndarray):
        self.q = np.ascontiguousarray(q).view(np.int8)
        self.scale = np.ascontiguousarray(scale, np.float32).reshape(-1)
        self.colscale = np.ascontiguousarray(colscale, np.float32).reshape(-1)
        self.n_out, self.n_in = self.q.shape
        if self.scale.size != self.n_out or self.colscale.size != self.n_in:
            raise ValueError(f"{self.scale.size} row and {self.colscale.size} column scales for {self.q.shape} rows")
        self.raw = self.q          # bytes the rows occupy (the scales are counted by nbytes)
        self.nbytes = int(self.q.nbytes + self.scale.nbytes + self.colscale.nbytes)

    def values(self) -> np.ndarray:
        """float32 (n_out, n_in) = c_j·r_i·q_ij (for statistics; the FFN never multiplies by these)."""
        return self.q.astype(np.float32) * self.scale[:, None] * self.colscale[None, :]


def group_part(p: np.ndarray, q: np.ndarray) -> np.ndarray | None:
    """One group's part (n_in,) from its float32 p (k,) and int8 rows q (k, n_in); None when m = 0."""
    m = np.float32(np.abs(p).max()) if p.size else np.float32(0)
    if not (np.float32(1e-30) <= m <= np.finfo(np.float32).max):     # zero, tiny (32767/m overflows) or not finite
        return None
    inv, s = np.float32(32767) / m, m / np.float32(32767)
    z = np.rint(p.astype(np.float32) * inv).astype(np.int64)
    acc = z @ q.astype(np.int64)                                       # exact; |acc| <= 64·32767·127 < 2^31
    return s * acc.astype(np.float32)


def axpy_rows_i8(h: np.ndarray, rows: I8Rows, group: int) -> np.ndarray:
    """y (T, n_in) = (Σ over groups of group_part)·c, for h (T, n_out) with inactive neurons at 0."""
    y = np.zeros((h.shape[0], rows.n_in), np.float32)
    for t in range(h.shape[0]):
        nz = np.flatnonzero(h[t])
        acc = np.zeros(rows.n_in, np.float32)
        for g in np.unique(nz // group):
            sel = nz[nz // group == g]
            part = group_part(h[t, sel] * rows.scale[sel], rows.q[sel])
            if part is not None:
                acc = acc + part
        y[t] = acc * rows.colscale
    return y
