# ggml_order.py — ggml's x86 (AVX-512/AVX2, FMA, F16C) float arithmetic in numpy, operation by operation:
# fused multiply-adds, SIMD lane accumulators and their horizontal sums, ggml_v_expf, the F16 dot products
# of attention, softmax, RoPE tables and the sequential double sums, so that reference.py computes the
# same float32 bits as llama.cpp's CPU backend. Quantized dot products live in qdot.py.
# Conventions: SIMD lanes are the FIRST axis of lane arrays; FMA is emulated in float64 (a·b of two float32
# is exact there, then one addition and a rounding to float32; double rounding is possible in theory only).
from __future__ import annotations

import ctypes
import ctypes.util

import numpy as np

F32, F64 = np.float32, np.float64
_H = float.fromhex


def fma32(a, b, c) -> np.ndarray:
    """float32 fused multiply-add a·b + c (vfmadd*ps), via float64."""
    return (np.asarray(a, F32).astype(F64) * np.asarray(b, F32) + np.asarray(c, F32)).astype(F32)


# ---------------------------------------------------------------- horizontal sums (lanes on axis 0)

def hsum8(v: np.ndarray) -> np.ndarray:
    """hsum_float_8 (AVX): (hi128 + lo128), then lanes 0+2 | 1+3, then 0+1; v (8, ...) float32."""
    r = v[4:8] + v[0:4]
    r = r[0:2] + r[2:4]
    return r[0] + r[1]


def reduce16(v: np.ndarray) -> np.ndarray:
    """_mm512_reduce_add_ps as GCC expands it: 256-bit halves, 128-bit halves, then (0+2, 1+3), 0+1."""
    r = v[8:16] + v[0:8]
    r = r[4:8] + r[0:4]
    r = r[0:2] + r[2:4]
    return r[0] + r[1]


def lanes(x: np.ndarray, width: int) -> np.ndarray:
    """(..., k) with k a multiple of width -> (width, ..., k/width): element i sits in lane i % width."""
    k = x.shape[-1]
    return np.moveaxis(x.reshape(*x.shape[:-1], k // width, width), -1, 0)


def pad_to(x: np.ndarray, mult: int, axis: int = -1) -> np.ndarray:
    """Zero-pad `axis` up to a multiple of mult (zero terms leave FMA chains unchanged)."""
    n = x.shape[axis]
    extra = -n % mult
    if not extra:
        return x
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, extra)
    return np.pad(x, pad)


# ---------------------------------------------------------------- sequential sums

def sum_sq_f64(x: np.ndarray) -> np.ndarray:
    """ggml_compute_forward_rms_norm_f32's sum: float32 squares added one by one into a double."""
    sq = (x * x).astype(F64)
    return np.cumsum(sq, axis=-1)[..., -1]


# ---------------------------------------------------------------- exp, silu (AVX-512 ggml_v_expf)

_E = dict(r=_H("0x1.8p23"), log2e=_H("0x1.715476p+0"), ln2hi=_H("0x1.62e4p-1"), ln2lo=_H("0x1.7f7d1cp-20"),
          c4=_H("0x1.0e4020p-7"), c3=_H("0x1.573e2ep-5"), c2=_H("0x1.555e66p-3"), c1=_H("0x1.fffdb6p-2"),
          c0=_H("0x1.ffffecp-1"))


def v_expf(x: np.ndarray) -> np.ndarray:
    """ggml_v_expf, the AVX-512 branch: n = round(x·log2 e), b = x − n·ln2 (two FMAs), a degree-5
    polynomial in FMA form, scaled by 2^n; |n| > 192 gives 0 (n < 0) or inf."""
    x = np.asarray(x, F32)
    c = {k: F32(v) for k, v in _E.items()}
    with np.errstate(invalid="ignore", over="ignore"):
        z = fma32(x, c["log2e"], c["r"])
        n = z - c["r"]
        b = fma32(-n, c["ln2lo"], fma32(-n, c["ln2hi"], x))
        u = b * b
        j = fma32(fma32(fma32(c["c4"], b, c["c3"]), u, fma32(c["c2"], b, c["c1"])), u, fma32(c["c0"], b, F32(1)))
        big = ~(np.abs(n) <= F32(192))
        res = np.ldexp(j, np.where(big, 0, n).astype(np.int32))
        if big.any():
            res = np.where(big, np.where(n <= 0, F32(0), F32(np.inf)), res)
    return res.astype(F32)


def v_silu(x: np.ndarray) -> np.ndarray:
    """ggml_v_silu: x / (1 + ggml_v_expf(0 − x))."""
    x = np.asarray(x, F32)
    return x / (F32(1) + v_expf(F32(0) - x))


def swiglu(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    """ggml_vec_swiglu_f32 (rows a multiple of 16 wide): silu(g)·u."""
    return v_silu(g) * u


# ---------------------------------------------------------------- softmax (ggml_compute_forward_soft_max_f32)

def softmax(kq: np.ndarray, scale: float, masked: np.ndarray) -> np.ndarray:
    """kq·scale + mask (0 / −inf); max; ggml_v_expf(x − max) 16 at a time, each group reduced in float
    and added into a double; then multiplied by (float)(1/sum). Rows are zero-padded to 16."""
    w = kq * F32(scale)
    w = np.where(masked, F32(-np.inf), w).astype(F32)
    mx = w.max(axis=-1, keepdims=True)
    e = v_expf(w - mx)
    ep = pad_to(e, 16)
    groups = reduce16(lanes(ep, 16)).astype(F64)             # (..., n/16)
    s = np.cumsum(groups, axis=-1)[..., -1:]
    return e * (1.0 / s).astype(F32)


# ---------------------------------------------------------------- F16 dot products

def dot_f16_tinyblas(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """llamafile tinyBLAS<16, __m512> on F16: C[..., j, i] = reduce16 of 16 lane accumulators, lane l
    taking a[i, 16s+l]·b[j, 16s+l] by FMA for s = 0, 1, ...; a (..., m, k), b (..., n, k) F16-valued float32
    -> (..., n, m) as ggml's dst. Products of two F16 values are exact in float32: each FMA is one add."""
    a, b = pad_to(a, 16), pad_to(b, 16)
    la, lb = lanes(a, 16), lanes(b, 16)                       # (16, ..., m, S), (16, ..., n, S)
    acc = None
    for s in range(la.shape[-1]):
        p = lb[..., :, None, s] * la[..., None, :, s]          # (16, ..., n, m)
        acc = p if acc is None else acc + p
    return reduce16(acc)


def dot_f16_vec(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """ggml_vec_dot_f16 (AVX-512): four 16-lane accumulators over steps of 64 (exact products, so float32
    adds), combined (0+2, 1+3, 0+1), reduce16 into a double, rounded to float. a (..., m, k), b (..., n, k)
    -> (..., n, m)."""
    a, b = pad_to(a, 64), pad_to(b, 64)
    k = a.shape[-1]
    acc = [None] * 4
    for i in range(0, k, 64):
        for j in range(4):
            sl = slice(i + 16 * j, i + 16 * j + 16)
            p = np.moveaxis(b[..., :, None, sl] * a[..., None, :, sl], -1, 0)   # (16, ..., n, m)
            acc[j] = p if acc[j] is None else acc[j] + p
    x0, x1 = acc[0] + acc[2], acc[1] + acc[3]
    return reduce16(x0 + x1)


# ---------------------------------------------------------------- RoPE (ggml_rope_cache_init, rotate_pairs)

_libm = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
_libm.powf.restype = _libm.sinf.restype = _libm.cosf.restype = ctypes.c_float
_libm.powf.argtypes = [ctypes.c_float, ctypes.c_float]
_libm.sinf.argtypes = _libm.cosf.argtypes = [ctypes.c_float]
_rope_rows: dict = {}


def rope_row(p: int, n_rot: int, base: float, freq_scale: float, freq_factors=None) -> tuple:
    """cos and sin (n_rot/2,) for position p: theta = p, theta *= powf(base, −2/n_rot) per pair (float32),
    angle = freq_scale·theta/ff, cosf/sinf from the C library as ggml calls them (sincosf)."""
    key = (p, n_rot, base, freq_scale, None if freq_factors is None else freq_factors.tobytes())
    if key not in _rope_rows:
        ts = F32(_libm.powf(F32(base), F32(F32(-2.0) / F32(n_rot))))
        theta, cs, sn = F32(p), [], []
        for i in range(n_rot // 2):
            t = theta if freq_factors is None else theta / F32(freq_factors[i])
            ang = F32(F32(freq_scale) * t)
            cs.append(_libm.cosf(ang))
            sn.append(_libm.sinf(ang))
            theta = F32(theta * ts)
        _rope_rows[key] = (np.array(cs, F32), np.array(sn, F32))
    return _rope_rows[key]


def rope_rotate(x0, x1, c, s):
    """One RoPE pair rotation as GCC vectorises rotate_pairs (vfmaddsub, NORMAL and NEOX alike):
    y0 = fma(x0, c, −x1·s), y1 = fma(x0, s, x1·c). (Its scalar tail, for pair counts that are not a multiple
    of the vector width, fuses y1 as fma(x1, c, x0·s); the head sizes pi2 meets never reach it.)"""
    return fma32(x0, c, -(x1 * s)), fma32(x0, s, x1 * c)


_libm.tanhf.restype = ctypes.c_float
_libm.tanhf.argtypes = [ctypes.c_float]
_gelu_table: list = []


def gelu_table() -> np.ndarray:
    """ggml_table_gelu_f16: for every F16 bit pattern h, fp16(0.5·x·(1 + tanhf(c·x·(1 + a·x²)))) with
    x = fp32(h), libm's tanhf and float32 operations in source order; returned as float32 (65536,)."""
    if not _gelu_table:
        x = np.arange(65536, dtype=np.uint16).view(np.float16).astype(F32)
        c, a, half, one = F32(0.7978845608028654), F32(0.044715), F32(0.5), F32(1.0)
        with np.errstate(invalid="ignore", over="ignore"):
            inner = c * x * (one + a * x * x)
            th = np.array([_libm.tanhf(float(v)) if np.isfinite(v) else np.nan for v in inner], dtype=F32)
            _gelu_table.append((half * x * (one + th)).astype(np.float16).astype(F32))
    return _gelu_table[0]


def gelu_f16(x: np.ndarray) -> np.ndarray:
    """ggml's GELU (tanh form) through its F16 table: input rounded to F16, table value (gelu_table)."""
    y = gelu_table()[x.astype(np.float16).view(np.uint16)]
    return np.where(x <= -10, F32(0), np.where(x >= 10, x, y))
