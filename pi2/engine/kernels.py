"""engine/kernels.py — thin numpy wrappers over the C kernels: type facts, dequantization, activation
quantization and matrix-vector products, for the planner, tests and benchmarks.

Owns: TypeInfo, kernel_info (the CPU's kernels and their variant), dequantize / quantize_act, repack_rows /
matvec_packed (test entry points, pi2_test.h) and matvec. Does not: loop over weights in Python.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pi2.engine.lib import check, enum, ffi, lib

IMPLS = enum("PI2_IMPL_", ("auto", "ref", "base"))   # best for this CPU / scalar reference / SIMD w/o extensions
_ISA_NAMES = enum("PI2_ISA_", ("avx2", "avx512vnni", "neon", "dotprod"))
_WEIGHT_TYPES = (0, 1, 30, 2, 3, 6, 7, 8, 12, 13, 14)   # ggml ids of the weight types kernel_info reports
_PACKED_TYPES = (3, 6, 7, 8, 12, 13, 14)   # Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K: the packed kernels kernel_info lists


@dataclass(frozen=True)
class TypeInfo:
    name: str            # ggml type name
    block_size: int      # values per block
    type_size: int       # bytes per block
    vec_dot_type: int    # activation format (ggml type id) rows are multiplied with
    has_vec_dot: bool    # a weight type matvec accepts
    vec_dot_impl: str    # kernel used: "ref", "avx2", "avx512vnni", "neon", "dotprod" ("" if none)

    def row_bytes(self, n_cols: int) -> int:
        return n_cols // self.block_size * self.type_size


def impl_id(impl: str) -> int:
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {sorted(IMPLS)}, not {impl!r}")
    return IMPLS[impl]


def _info(qtype: int, impl: str):
    out = ffi.new("pi2_type_info *")
    check(lib.pi2_kernel_info(int(qtype), impl_id(impl), out))
    return out


def type_info(qtype: int, impl: str = "auto") -> TypeInfo:
    """Block geometry and kernel choice for ggml type id `qtype`."""
    out = _info(qtype, impl)
    kimpl = ffi.string(out.vec_dot_impl).decode() if out.vec_dot_impl != ffi.NULL else ""
    return TypeInfo(ffi.string(out.name).decode(), out.block_size, out.type_size, out.vec_dot_type,
                    bool(out.has_vec_dot), kimpl)


def kernel_info() -> dict:
    """The ISA extensions the auto kernels use and, per weight type, which kernel each impl runs."""
    first = _info(0, "auto")
    types, packed = {}, []
    for tid in _WEIGHT_TYPES:
        info = {impl: type_info(tid, impl) for impl in IMPLS}
        types[info["ref"].name] = {impl: ti.vec_dot_impl for impl, ti in info.items()}
        if tid in _PACKED_TYPES and _info(tid, "auto").packed:
            packed.append(info["ref"].name)
    return {"isa": [n for n, bit in _ISA_NAMES.items() if first.isa & bit], "vec_dot": types,
            "variant": ffi.string(first.variant).decode(), "variant_why": ffi.string(first.variant_why).decode(),
            "packed": packed}


def _rows(raw: np.ndarray, qtype: int, ti: TypeInfo, n_cols: int, impl: str) -> np.ndarray:
    # zero rows with an unbounded stride: C reports a bad n_cols in its own words
    check(lib.pi2_dequantize_rows(int(qtype), ffi.NULL, 2**63, ffi.NULL, 0, n_cols, impl_id(impl)))
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    rb = ti.row_bytes(n_cols)
    if rb == 0 or raw.size % rb:
        raise ValueError(f"{raw.size} bytes is not a whole number of {ti.name} rows of {n_cols} values")
    return raw.reshape(-1, rb)


def dequantize(raw: np.ndarray, qtype: int, n_cols: int, impl: str = "auto") -> np.ndarray:
    """float32 (rows, n_cols) from raw bytes of whole rows of ggml type `qtype`."""
    ti = type_info(qtype, impl)
    rows = _rows(raw, qtype, ti, n_cols, impl)
    out = np.empty((rows.shape[0], n_cols), dtype=np.float32)
    check(lib.pi2_dequantize_rows(int(qtype), ffi.from_buffer(rows), rows.shape[1],
                                  ffi.from_buffer("float[]", out, require_writable=True),
                                  out.shape[0], n_cols, impl_id(impl)))
    return out


def quantize_act(x: np.ndarray, vdt: int) -> np.ndarray:
    """uint8 bytes of the float vector x in activation format `vdt` (ggml's reference quantizer)."""
    x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    ti = type_info(vdt, "ref")
    out = np.empty(max(ti.row_bytes(x.size), 1), dtype=np.uint8)
    check(lib.pi2_quantize_act(int(vdt), ffi.from_buffer("float[]", x), x.size,
                               ffi.from_buffer(out, require_writable=True)))
    return out


def matvec(raw: np.ndarray, qtype: int, n_cols: int, x: np.ndarray, impl: str = "auto") -> np.ndarray:
    """float32 (rows,) = each row of `raw` (ggml type qtype) · x. x is float (quantized here to the
    type's vec_dot_type) or uint8 bytes already in that format (from quantize_act)."""
    ti = type_info(qtype, impl)
    if not ti.has_vec_dot:
        check(lib.pi2_matvec(int(qtype), ffi.NULL, 2**63, 0, n_cols, ffi.NULL, ffi.NULL, impl_id(impl)))
    rows = _rows(raw, qtype, ti, n_cols, impl)
    xq = x if x.dtype == np.uint8 else quantize_act(x, ti.vec_dot_type)
    need = type_info(ti.vec_dot_type, "ref").row_bytes(n_cols)
    if xq.size != need:
        raise ValueError(f"activation has {xq.size} bytes, {need} expected for {n_cols} values")
    out = np.empty(rows.shape[0], dtype=np.float32)
    check(lib.pi2_matvec(int(qtype), ffi.from_buffer(rows), rows.shape[1], rows.shape[0], n_cols,
                         ffi.from_buffer(np.ascontiguousarray(xq)),
                         ffi.from_buffer("float[]", out, require_writable=True), impl_id(impl)))
    return out


def repack_rows(raw: np.ndarray, qtype: int, n_cols: int, unpack: bool = False) -> np.ndarray:
    """pi2_repack_rows: raw's rows (a multiple of 8) in the x8 packed layout, or back with unpack."""
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    out = np.empty_like(raw)
    check(lib.pi2_repack_rows(int(qtype), ffi.from_buffer(raw), raw.shape[0], n_cols,
                              ffi.from_buffer(out, require_writable=True), int(unpack)))
    return out


def matvec_packed(packed: np.ndarray, qtype: int, n_cols: int, xq: np.ndarray, impl: str = "auto") -> np.ndarray:
    """pi2_matvec_packed: float32 (rows,) of packed rows (repack_rows) · xq (bytes from quantize_act)."""
    packed = np.ascontiguousarray(packed, dtype=np.uint8)
    out = np.empty(packed.shape[0], dtype=np.float32)
    check(lib.pi2_matvec_packed(int(qtype), ffi.from_buffer(packed), packed.shape[0], n_cols,
                                ffi.from_buffer(np.ascontiguousarray(xq)),
                                ffi.from_buffer("float[]", out, require_writable=True), impl_id(impl)))
    return out
