"""engine.py — the only module that imports the compiled extension pi2._pi2.

Owns: loading the extension, the ABI check, turning C status codes into Pi2 exceptions, and thin
numpy wrappers over the C kernels (dequantize, quantize_act, matvec) for tests and benchmarks.
Does not: loop over weights in Python or decide anything about models.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pi2.errors import EngineError, ModelFormatError, UnsupportedError

ABI_VERSION = 2

try:
    from pi2._pi2 import ffi, lib
except ImportError as e:  # pragma: no cover - depends on the install
    raise ImportError(f"pi2's compiled core is missing ({e}); reinstall with `pip install .`") from None

if lib.pi2_abi_version() != ABI_VERSION:  # pragma: no cover
    raise ImportError(f"pi2's compiled core has ABI {lib.pi2_abi_version()}, expected {ABI_VERSION}: "
                      "a stale build; reinstall with `pip install .`")

_ERRORS = {lib.PI2_ERR_FORMAT: ModelFormatError, lib.PI2_ERR_UNSUPPORTED: UnsupportedError}


def check(status: int) -> int:
    """Raise the matching Pi2Error for a negative status; return the status otherwise."""
    if status < 0:
        msg = ffi.string(lib.pi2_last_error()).decode("utf-8", "replace") or f"C core error {status}"
        raise _ERRORS.get(status, EngineError)(msg)
    return status


# ---- kernels ----------------------------------------------------------------------------------

IMPLS = {"auto": 0, "ref": 1, "base": 2}   # pi2_impl: best for this CPU / scalar reference / SIMD w/o extensions
_ISA_NAMES = {1: "avx2", 2: "avx512vnni", 4: "neon", 8: "dotprod"}


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


def _impl(impl: str) -> int:
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {sorted(IMPLS)}, not {impl!r}")
    return IMPLS[impl]


def type_info(qtype: int, impl: str = "auto") -> TypeInfo:
    """Block geometry and kernel choice for ggml type id `qtype`."""
    out = ffi.new("pi2_type_info *")
    check(lib.pi2_kernel_type_info(int(qtype), _impl(impl), out))
    kimpl = ffi.string(out.vec_dot_impl).decode() if out.vec_dot_impl != ffi.NULL else ""
    return TypeInfo(ffi.string(out.name).decode(), out.block_size, out.type_size, out.vec_dot_type,
                    bool(out.has_vec_dot), kimpl)


def kernel_info() -> dict:
    """The ISA extensions the auto kernels use and, per weight type, which kernel each impl runs."""
    isa = lib.pi2_kernel_isa()
    types = {}
    for tid in (0, 1, 30, 2, 3, 6, 7, 8, 12, 13, 14):
        info = {impl: type_info(tid, impl) for impl in IMPLS}
        types[info["ref"].name] = {impl: ti.vec_dot_impl for impl, ti in info.items()}
    return {"isa": [n for bit, n in _ISA_NAMES.items() if isa & bit], "vec_dot": types}


def _rows(raw: np.ndarray, qtype: int, ti: TypeInfo, n_cols: int, impl: str) -> np.ndarray:
    # zero rows with an unbounded stride: C reports a bad n_cols in its own words
    check(lib.pi2_dequantize_rows(int(qtype), ffi.NULL, 2**63, ffi.NULL, 0, n_cols, _impl(impl)))
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
                                  out.shape[0], n_cols, _impl(impl)))
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
        check(lib.pi2_matvec(int(qtype), ffi.NULL, 2**63, 0, n_cols, ffi.NULL, ffi.NULL, _impl(impl)))
    rows = _rows(raw, qtype, ti, n_cols, impl)
    xq = x if x.dtype == np.uint8 else quantize_act(x, ti.vec_dot_type)
    need = type_info(ti.vec_dot_type, "ref").row_bytes(n_cols)
    if xq.size != need:
        raise ValueError(f"activation has {xq.size} bytes, {need} expected for {n_cols} values")
    out = np.empty(rows.shape[0], dtype=np.float32)
    check(lib.pi2_matvec(int(qtype), ffi.from_buffer(rows), rows.shape[1], rows.shape[0], n_cols,
                         ffi.from_buffer(np.ascontiguousarray(xq)),
                         ffi.from_buffer("float[]", out, require_writable=True), _impl(impl)))
    return out
