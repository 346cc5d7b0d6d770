"""moe_matmul.py — which kernel ggml's CPU backend (x86-64, AVX-512, repack on) runs for each matrix product of a
MoE-family model, and the products themselves: `Linear` for ggml_mul_mat, `ExpertLinear` for ggml_mul_mat_id.

ggml_mul_mat (dense: attention, router, shared expert, output), by weight type:
  F32, F16  one token: ggml_vec_dot_f32 / _f16; 2+ tokens: llamafile tinyBLAS (k % 16 == 0, rows % 4 == 0)
  Q4_0      repacked q4_0_8x8 (rows % 8 == 0): GEMM for groups of 4 tokens, GEMV for the rest (same float math)
  Q4_K      repacked q4_K_8x8 (rows % 8 == 0): GEMM for groups of 4 tokens, GEMV for the rest (qdot.py)
  Q6_K      vec_dot below 8 tokens, the tiled K-quant kernel from 8 (qdot.py)
  Q8_0, Q5_0, Q4_1  vec_dot and tinyBLAS_Q0 compute alike (qdot.py)
ggml_mul_mat_id (the experts): the batch's rows are grouped by expert (token order within an expert), and
  each expert's rows are multiplied by its slice of the 3-D tensor:
  Q4_0, Q4_K  repacked: the GEMV, one token at a time (forward_mul_mat_id in ggml-cpu/repack.cpp)
  Q6_K (and other K-quants not repacked)  the tiled kernel when the expert has 8+ rows in this batch, else vec_dot
  every other type  vec_dot per (row, token): no llamafile tinyBLAS in mul_mat_id
So a token's expert output depends on the batch only through Q6_K's 8-row switch.
"""
from __future__ import annotations

import numpy as np

from pi2.reference import fdot, qdot
from pi2.reference.quants import F16, F32, Q4_0, Q4_K, Q8_K, QuantLinear, quantize_act

_F32 = np.float32


def _float_rows(raw: np.ndarray, qtype: int, n_in: int) -> np.ndarray:
    dt = np.float32 if qtype == F32 else np.float16
    return np.ascontiguousarray(raw).view(dt).reshape(raw.shape[0], n_in).astype(_F32)


class Linear(QuantLinear):
    """ggml_mul_mat of one 2-D weight on this CPU (see the module doc); QuantLinear for the types it covers."""

    def __init__(self, raw: np.ndarray, qtype: int, n_cols: int):
        super().__init__(raw, qtype, n_cols)
        self._fw = None                     # F32/F16 values, or Q4_0 (q, d)

    def _own(self):
        if self._fw is None:
            self._fw = (fdot.q4_0_blocks(self.raw, self.n_in) if self.qtype == Q4_0
                        else _float_rows(self.raw, self.qtype, self.n_in))
        return self._fw

    def __call__(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, _F32)
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.n_in)
        if self.qtype in (F32, F16):
            w = self._own()
            batch = fdot.tinyblas_ok(x2.shape[0], self.n_out, self.n_in)
            if self.qtype == F32:
                out = fdot.dot_f32_tinyblas(w, x2) if batch else fdot.dot_f32_vec(w, x2)
            else:
                out = fdot.dot_f16_tinyblas(w, x2) if batch else fdot.dot_f16_vec(w, x2)
            return out.reshape(*lead, self.n_out)
        if self.qtype == Q4_0:
            q, d = self._own()
            if self.n_out % 8 == 0:
                out = fdot.dot_q4_0_repack(q, d, x2)
            else:
                out = qdot.dot_q8_lanes(qdot.Weights(q=q, d=d), quantize_act(x2, 8))
            return out.reshape(*lead, self.n_out)
        return super().__call__(x)


class ExpertLinear:
    """One 3-D expert tensor ({n_in, n_out, n_expert}) as ggml_mul_mat_id multiplies it: `__call__(e, x)` is
    expert e's product with the rows x (cne1, n_in) routed to it in this batch, in their batch order."""

    def __init__(self, raw: np.ndarray, qtype: int, n_in: int, n_out: int, n_expert: int):
        self.raw, self.qtype = raw, qtype
        self.n_in, self.n_out, self.n_expert = n_in, n_out, n_expert
        self._experts: dict[int, object] = {}

    def slice(self, e: int) -> np.ndarray:
        """Expert e's rows (n_out, row_bytes): contiguous in the file."""
        return self.raw[e * self.n_out:(e + 1) * self.n_out]

    def _expert(self, e: int):
        if e not in self._experts:
            raw = self.slice(e)
            if self.qtype in (F32, F16):
                self._experts[e] = _float_rows(raw, self.qtype, self.n_in)
            elif self.qtype == Q4_0:
                self._experts[e] = fdot.q4_0_blocks(raw, self.n_in)
            else:
                self._experts[e] = QuantLinear(raw, self.qtype, self.n_in)
        return self._experts[e]

    def __call__(self, e: int, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, _F32).reshape(-1, self.n_in)
        w = self._expert(e)
        if self.qtype == F32:
            return fdot.dot_f32_vec(w, x)
        if self.qtype == F16:
            return fdot.dot_f16_vec(w, x)
        if self.qtype == Q4_0:
            q, d = w
            if self.n_out % 8 == 0:
                return fdot.dot_q4_0_repack(q, d, x)
            return qdot.dot_q8_lanes(qdot.Weights(q=q, d=d), quantize_act(x, 8))
        if self.qtype == Q4_K and self.n_out % 8 == 0:
            return qdot.dot_q4_k_repack(w._kernel_weights(), quantize_act(x, Q8_K), gemv_only=True)
        return w(x)        # Q6_K: QuantLinear picks tiled from 8 rows, vec_dot below; others are batch-free


def group_by_expert(selected: np.ndarray, n_expert: int) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """mul_mat_id's row grouping: for each expert in index order, the (token, slot) pairs routed to it, in
    token order (ids are scanned token by token, slot by slot). Experts with no row are left out."""
    n_tok, k = selected.shape
    flat = selected.reshape(-1)
    order = np.argsort(flat, kind="stable")              # stable: token-major scan order within an expert
    counts = np.bincount(flat, minlength=n_expert)
    out, start = [], 0
    for e in range(n_expert):
        c = int(counts[e])
        if c:
            rows = order[start:start + c]
            out.append((e, rows // k, rows % k))
            start += c
    return out
