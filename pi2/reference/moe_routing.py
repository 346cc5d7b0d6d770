"""moe_routing.py — a MoE router's math after its matrix product, as llama.cpp's CPU backend computes it.

Owns: the gating functions (ggml_soft_max with its libm tail, ggml_sigmoid, softmax_weight, sqrt_softplus), the
expert selection (ggml_argsort_top_k: libstdc++'s std::sort on indices, so ties fall as that introsort leaves
them), the weights of the selected experts, their normalisation (sum in double, clamped below at 2^-14) and scale.
Does not: multiply by the router (reference/moe.py, through QuantLinear) or run experts (moe_matmul.py).
Everything is float32 unless a step is said to use double; arrays are (n_tokens, n_expert).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import math

import numpy as np

from pi2.reference import ggml_order as go

F32 = np.float32
NORM_CLAMP = F32(6.103515625e-5)          # ggml_clamp(sum, 2^-14, inf) in build_moe_ffn

_libm = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
for _fn in ("expf", "logf"):
    getattr(_libm, _fn).restype = ctypes.c_float
    getattr(_libm, _fn).argtypes = [ctypes.c_float]


def _libm_map(fn, x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, F32)
    f = getattr(_libm, fn)
    return np.array([f(float(v)) for v in x.ravel()], F32).reshape(x.shape)


def expf(x: np.ndarray) -> np.ndarray:
    """The C library's expf, element by element (ggml's scalar paths call it)."""
    return _libm_map("expf", x)


def softmax(x: np.ndarray) -> np.ndarray:
    """ggml_soft_max over the last axis, no mask, scale 1 (ggml_compute_forward_soft_max_f32 with
    ggml_vec_soft_max_f32, AVX-512): max; then per whole group of 16, ggml_v_expf(x − max) reduced with
    _mm512_reduce_add_ps and added into a double; the last n % 16 values through libm expf, each added into the
    double; every value then times (float)(1.0 / sum)."""
    x = np.asarray(x, F32)
    n = x.shape[-1]
    mx = x.max(axis=-1, keepdims=True)
    d = x - mx
    n16 = n - n % 16
    e = np.empty_like(d)
    s = np.zeros(x.shape[:-1], np.float64)
    if n16:
        e[..., :n16] = go.v_expf(d[..., :n16])
        groups = go.reduce16(go.lanes(e[..., :n16], 16)).astype(np.float64)        # (..., n16/16)
        for g in range(groups.shape[-1]):
            s += groups[..., g]
    if n16 < n:
        e[..., n16:] = expf(d[..., n16:])
        for i in range(n16, n):
            s += e[..., i].astype(np.float64)
    return e * (1.0 / s).astype(F32)[..., None]


def sigmoid(x: np.ndarray) -> np.ndarray:
    """ggml_sigmoid: 1.f / (1.f + expf(−x)) per element (libm expf)."""
    x = np.asarray(x, F32)
    return F32(1) / (F32(1) + expf(-x))


def sqrt_softplus(x: np.ndarray) -> np.ndarray:
    """sqrt(softplus(x)): ggml_softplus is x > 20 ? x : logf(1 + expf(x)), then sqrtf."""
    x = np.asarray(x, F32)
    sp = np.where(x > F32(20), x, _libm_map("logf", F32(1) + expf(x)))
    return np.sqrt(sp).astype(F32)


def gate_probs(logits: np.ndarray, gating: str) -> np.ndarray:
    """build_moe_ffn's probs from the router logits."""
    if gating == "softmax":
        return softmax(logits)
    if gating == "sigmoid":
        return sigmoid(logits)
    if gating == "softmax_weight":
        return np.asarray(logits, F32)
    if gating == "sqrt_softplus":
        return sqrt_softplus(logits)
    raise ValueError(f"unknown gating function {gating!r}")


# ---------------------------------------------------------------- std::sort (libstdc++), descending

def _introsort(idx: list, key: list) -> None:
    """libstdc++'s std::sort of `idx` with comp(a, b) = key[a] > key[b]: introsort (median-of-three pivot moved
    to the front, unguarded partition, depth limit 2·floor(log2 n) then heapsort) down to runs of 16, then
    insertion sort. Not stable: this is what decides the order of tied scores."""
    comp = lambda a, b: key[a] > key[b]  # noqa: E731
    n = len(idx)
    if n < 2:
        return
    _introsort_loop(idx, 0, n, 2 * int(math.floor(math.log2(n))), comp)
    if n > 16:
        _insertion_sort(idx, 0, 16, comp)
        for i in range(16, n):
            _linear_insert(idx, i, comp)
    else:
        _insertion_sort(idx, 0, n, comp)


def _introsort_loop(a, first, last, depth, comp):
    while last - first > 16:
        if depth == 0:
            _heap_sort(a, first, last, comp)
            return
        depth -= 1
        mid = first + (last - first) // 2
        _median_to_first(a, first, first + 1, mid, last - 1, comp)
        cut = _unguarded_partition(a, first + 1, last, first, comp)
        _introsort_loop(a, cut, last, depth, comp)
        last = cut


def _median_to_first(a, result, i, j, k, comp):
    x, y, z = a[i], a[j], a[k]
    if comp(x, y):
        m = j if comp(y, z) else (k if comp(x, z) else i)
    elif comp(x, z):
        m = i
    else:
        m = k if comp(y, z) else j
    a[result], a[m] = a[m], a[result]


def _unguarded_partition(a, first, last, pivot, comp):
    while True:
        while comp(a[first], a[pivot]):
            first += 1
        last -= 1
        while comp(a[pivot], a[last]):
            last -= 1
        if not first < last:
            return first
        a[first], a[last] = a[last], a[first]
        first += 1


def _linear_insert(a, last, comp):
    val = a[last]
    nxt = last - 1
    while comp(val, a[nxt]):
        a[last] = a[nxt]
        last = nxt
        nxt -= 1
    a[last] = val


def _insertion_sort(a, first, last, comp):
    for i in range(first + 1, last):
        if comp(a[i], a[first]):
            val = a[i]
            a[first + 1:i + 1] = a[first:i]
            a[first] = val
        else:
            _linear_insert(a, i, comp)


def _adjust_heap(a, first, hole, length, value, comp):
    top, child = hole, hole
    while child < (length - 1) // 2:
        child = 2 * (child + 1)
        if comp(a[first + child], a[first + child - 1]):
            child -= 1
        a[first + hole] = a[first + child]
        hole = child
    if length % 2 == 0 and child == (length - 2) // 2:
        child = 2 * (child + 1)
        a[first + hole] = a[first + child - 1]
        hole = child - 1
    parent = (hole - 1) // 2
    while hole > top and comp(a[first + parent], value):
        a[first + hole] = a[first + parent]
        hole = parent
        parent = (hole - 1) // 2
    a[first + hole] = value


def _heap_sort(a, first, last, comp):
    """std::__partial_sort(first, last, last): make_heap, then sort_heap."""
    n = last - first
    if n >= 2:
        for parent in range((n - 2) // 2, -1, -1):
            _adjust_heap(a, first, parent, n, a[first + parent], comp)
    while last - first > 1:
        last -= 1
        value = a[last]
        a[last] = a[first]
        _adjust_heap(a, first, 0, last - first, value, comp)


def argsort_desc(scores: np.ndarray) -> np.ndarray:
    """ggml_argsort(..., GGML_SORT_ORDER_DESC) per row: int32 indices. Rows without equal scores have one
    answer (a stable sort gives it fast); rows with ties (or NaNs) go through the std::sort emulation."""
    s = np.asarray(scores, F32)
    out = np.argsort(-s, axis=-1, kind="stable").astype(np.int32)
    flat_s, flat_o = s.reshape(-1, s.shape[-1]), out.reshape(-1, s.shape[-1])
    for r in range(flat_s.shape[0]):
        row = flat_s[r]
        if np.unique(row).size != row.size or np.isnan(row).any():
            idx = list(range(row.size))
            _introsort(idx, [float(v) for v in row])
            flat_o[r] = idx
    return out


# ---------------------------------------------------------------- the selected experts' weights

def route(logits: np.ndarray, k: int, gating: str, norm: bool, scale: float = 0.0):
    """build_moe_ffn from the logits to (selected (T, k) int32, weights (T, k) float32): probs, top-k of probs
    (ggml_argsort_top_k: the first k of the descending argsort), weights = probs of the selected experts
    (softmax_weight: their softmax), normalised (ggml_sum_rows sums in double then rounds to float; clamped below
    at 2^-14; ggml_div) and scaled (ggml_scale, unless scale is 0 or 1). Slot j of a token is its j-th best."""
    probs = gate_probs(logits, gating)
    selected = argsort_desc(probs)[..., :k]
    w = np.take_along_axis(probs, selected, axis=-1)
    if gating == "softmax_weight":
        w = softmax(w)
    if norm:
        total = np.zeros(w.shape[:-1], np.float64)
        for j in range(k):
            total += w[..., j].astype(np.float64)
        total = np.maximum(total.astype(F32), NORM_CLAMP)
        w = w / total[..., None]
    if scale not in (0.0, 1.0):
        w = w * F32(scale)
    return selected, w.astype(F32)
