"""kv_cache.py — the KV cache's types (-ctk / -ctv) in numpy: what llama.cpp 0c1e570 stores and computes with flash
attention off, roundings included.

F16 K and V: values rounded to F16 (forward.attention). A quantized K (Q8_0): llama.cpp's KV cache first rotates
every query and key head by an orthonormal Walsh-Hadamard matrix (`attn_rot_k`: ggml_compute_forward_fwht, whenever
the K type is quantized and head_dim is a multiple of 64), stores the rotated keys as Q8_0 blocks (quantize_row_q8_0,
x86), and computes K·Q as a Q8_0 mul_mat: the query quantized to Q8_0, ggml_vec_dot_q8_0_q8_0 for one token and
tinyBLAS_Q0_AVX for batches, which add in the same order (qdot.dot_q8_lanes). A context shift dequantizes the moved
keys, rotates them back, applies RoPE, rotates them forward and quantizes again (llama_kv_cache::build_rope_shift).
Q4_0, Q4_1, Q5_0 and Q5_1 keys (BlockKeys) go the same way with ggml_set_rows' quantizer for the type (the scalar
quantize_row_*_ref, as gguf.quants computes it) and the type's vec_dot on the query quantized to its vec_dot type:
Q4_0 and Q5_0 with Q8_0 (8 lanes, as Q8_0; tinyBLAS_Q0_AVX for batches adds alike), Q4_1 and Q5_1 with Q8_1 (the
lanes plus the fma chain of block minimum × query block sum; no tinyBLAS for them).
A quantized V (-ctv, flash attention only, as llama.cpp) is stored by the same classes (make_values): ggml_set_rows
quantizes V rows as it does K rows; flash_attn.py reads them back as floats. llama.cpp rotates those values too
(`attn_rot_v`: fwht in runs of 64 whenever head_dim_v is a multiple of 64, the attention output rotated back):
forward.py does that around the store and the attention, not these classes.
Does not: the softmax or the product with V (forward.attention, flash_attn.py).
"""
from __future__ import annotations

import numpy as np

from pi2.reference import qdot
from pi2.reference.quants import (GGML_TYPES, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, _kernel_blocks, dequantize,
                                  quantize_act, quantize_weight)

F32 = np.float32


def rot_size(head_dim: int) -> int:
    """The Hadamard size llama.cpp rotates quantized keys with (llama_kv_cache::build_input_k_rot): the largest power
    of two >= 64 dividing head_dim; 0 when head_dim is not a multiple of 64 (no rotation)."""
    if head_dim % 64:
        return 0
    n = 64
    while head_dim % (2 * n) == 0:
        n *= 2
    return n


def fwht(x: np.ndarray, n: int) -> np.ndarray:
    """ggml_compute_forward_fwht on every run of n values of x (..., D), D a multiple of n: each value times
    (float)(1/sqrtf(n)), then the butterflies (u + v, u - v) for strides 1, 2, 4, ... in float32 (the SIMD passes'
    FMA u + v·(-1) rounds as u - v)."""
    shape = x.shape
    y = (np.asarray(x, F32).reshape(-1, n) * (F32(1.0) / np.sqrt(F32(n)))).astype(F32)
    step = 1
    while step < n:
        b = y.reshape(-1, n // (2 * step), 2, step)
        u, v = b[:, :, 0].copy(), b[:, :, 1].copy()
        b[:, :, 0], b[:, :, 1] = u + v, u - v
        step *= 2
    return y.reshape(shape)


class QuantKeys:
    """A layer-by-layer Q8_0 K cache: d (n_layer, n_ctx, n_head_kv, nb) float16, q (..., nb, 32) int8, the keys
    rotated by fwht(·, rot) when rot."""

    def __init__(self, n_layer: int, n_ctx: int, n_head_kv: int, head_dim: int):
        nb = head_dim // 32
        self.d = np.zeros((n_layer, n_ctx, n_head_kv, nb), np.float16)
        self.q = np.zeros((n_layer, n_ctx, n_head_kv, nb, 32), np.int8)
        self.rot = rot_size(head_dim)

    def rotate(self, x: np.ndarray) -> np.ndarray:
        """Queries or keys (..., head_dim) as the cache sees them: rotated when rot."""
        return fwht(x, self.rot) if self.rot else x

    def store(self, il: int, pos, k: np.ndarray) -> None:
        """Keys k (n, n_head_kv, head_dim) after rotate(), at positions pos of layer il (quantize_row_q8_0)."""
        d, q = quantize_act(k, Q8_0)
        self.d[il, pos], self.q[il, pos] = d, q

    def values(self, il: int, cells) -> np.ndarray:
        """The float32 keys of `cells` (dequantize_row_q8_0: d·q), (n, n_head_kv, head_dim)."""
        d, q = self.d[il, cells].astype(F32), self.q[il, cells].astype(F32)
        v = (d[..., None] * q).astype(F32)
        return v.reshape(*v.shape[:-2], -1)

    def kq(self, il: int, qh: np.ndarray, n_kv: int) -> np.ndarray:
        """K·Q of layer il: qh (n_head_kv, m, head_dim) float32 (rotated) queries -> (n_head_kv, m, n_kv), the
        queries quantized to Q8_0 and multiplied in ggml_vec_dot_q8_0_q8_0's order."""
        out = []
        for h in range(qh.shape[0]):
            w = qdot.Weights(q=np.ascontiguousarray(self.q[il, :n_kv, h].transpose(1, 2, 0)),
                             d=np.ascontiguousarray(self.d[il, :n_kv, h].astype(F32).T))
            out.append(qdot.dot_q8_lanes(w, quantize_act(qh[h], Q8_0)))
        return np.stack(out)

    def move(self, il: int, src: slice, dst: slice) -> None:
        """Copy cells src to dst unchanged (values after a context shift)."""
        self.d[il, dst], self.q[il, dst] = self.d[il, src].copy(), self.q[il, src].copy()

    def shift(self, il: int, src: slice, dst: slice, rope_fn) -> None:
        """Move keys src to dst as build_rope_shift does on a quantized cache: dequantize, rotate back, rope_fn
        (the keys (m, n_head_kv, head_dim) -> rotated by RoPE), rotate forward, quantize."""
        k = self.rotate(rope_fn(self.rotate(self.values(il, src))))
        d, q = quantize_act(k, Q8_0)
        self.d[il, dst], self.q[il, dst] = d, q


BLOCK_TYPES = (Q4_0, Q4_1, Q5_0, Q5_1)
_DOT = {Q4_0: (qdot.dot_q8_lanes, Q8_0), Q5_0: (qdot.dot_q8_lanes, Q8_0), Q4_1: (qdot.dot_q4_1_q8_1, Q8_1),
        Q5_1: (qdot.dot_q4_1_q8_1, Q8_1)}


class BlockKeys(QuantKeys):
    """A K cache of Q4_0, Q4_1, Q5_0 or Q5_1 blocks: raw (n_layer, n_ctx, n_head_kv, head bytes) uint8, the keys
    rotated by fwht(·, rot) when rot."""

    def __init__(self, n_layer: int, n_ctx: int, n_head_kv: int, head_dim: int, qtype: int):
        self.qtype, self.head_dim = qtype, head_dim
        size = GGML_TYPES[qtype][2]
        self.raw = np.zeros((n_layer, n_ctx, n_head_kv, head_dim // 32 * size), np.uint8)
        self.rot = rot_size(head_dim)

    def _quantize(self, k: np.ndarray) -> np.ndarray:
        return quantize_weight(k.reshape(-1, self.head_dim), self.qtype).reshape(*k.shape[:-1], -1)

    def store(self, il: int, pos, k: np.ndarray) -> None:
        self.raw[il, pos] = self._quantize(k)

    def values(self, il: int, cells) -> np.ndarray:
        raw = self.raw[il, cells]
        v = dequantize(raw.reshape(-1, raw.shape[-1]), self.qtype, self.head_dim)
        return v.reshape(*raw.shape[:-1], self.head_dim).astype(F32)

    def kq(self, il: int, qh: np.ndarray, n_kv: int) -> np.ndarray:
        dot, vdt = _DOT[self.qtype]
        out = []
        for h in range(qh.shape[0]):
            w = _kernel_blocks(np.ascontiguousarray(self.raw[il, :n_kv, h]), self.qtype, n_kv)
            out.append(dot(w, quantize_act(qh[h], vdt)))
        return np.stack(out)

    def move(self, il: int, src: slice, dst: slice) -> None:
        self.raw[il, dst] = self.raw[il, src].copy()

    def shift(self, il: int, src: slice, dst: slice, rope_fn) -> None:
        self.raw[il, dst] = self._quantize(self.rotate(rope_fn(self.rotate(self.values(il, src)))))


def make_keys(qtype: int, n_layer: int, n_ctx: int, n_head_kv: int, head_dim: int) -> QuantKeys | None:
    """The quantized K cache of ggml type qtype (None for F16)."""
    if qtype == Q8_0:
        return QuantKeys(n_layer, n_ctx, n_head_kv, head_dim)
    return BlockKeys(n_layer, n_ctx, n_head_kv, head_dim, qtype) if qtype in BLOCK_TYPES else None


def make_values(qtype: int, n_layer: int, n_ctx: int, n_head_kv: int, head_dim_v: int) -> QuantKeys | None:
    """The quantized V cache of ggml type qtype (None for F16): the K classes, storing what they are given (the caller
    rotates: forward.py)."""
    v = make_keys(qtype, n_layer, n_ctx, n_head_kv, head_dim_v)
    if v is not None:
        v.rot = 0
    return v
