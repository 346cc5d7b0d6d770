"""cinternal.py — the C core's internal entry points (ops.h, matmul.h, threadpool.h) for tests.

They are not in pi2.h (Python never calls them in production); the extension exports them as
ordinary symbols, so cffi's ABI mode opens the same shared object and declares them here, copied
from the headers named beside each block. Owns: those declarations and thin numpy wrappers.
"""
from __future__ import annotations

import numpy as np
from cffi import FFI

from pi2 import _pi2

ffi = FFI()
ffi.cdef("""
typedef uint16_t pi2_fp16;
/* ops.h */
void pi2_rms_norm(float *y, const float *x, const float *w, int64_t n, float eps);
void pi2_rope_cache(float *cs, int32_t pos, int32_t n_rot, float base, float freq_scale, const float *freq_factors);
void pi2_rope(float *x, int32_t n_heads, int32_t head_dim, int32_t n_rot, const float *cs, int32_t neox);
void pi2_gelu_table(pi2_fp16 *table);
void pi2_ffn_activate(float *gate, const float *up, int64_t n, int32_t act, const pi2_fp16 *gelu_table);
typedef struct pi2_pool pi2_pool;
typedef struct {
    const float *q; const float *k; const float *v; float *out; float *scores; float *qf; float *acc;
    int32_t n_tok, pos0, n_ctx; int32_t n_head, n_head_kv, head_dim, head_dim_v; int32_t window; float scale;
} pi2_attn;
void pi2_attention(pi2_pool *pool, pi2_attn *a);
int64_t pi2_attn_acc_floats(int32_t head_dim, int32_t head_dim_v);
/* threadpool.h */
int pi2_pool_create(int32_t n_threads, pi2_pool **out);
void pi2_pool_free(pi2_pool *pool);
/* matmul.h */
typedef struct { const uint8_t *data; int32_t type; int64_t n_in, n_out; size_t row_bytes; const uint8_t *packed; } pi2_weight;
typedef struct { const pi2_weight *w; float *out; } pi2_mm;
typedef struct { pi2_pool *pool; int32_t impl; uint8_t *xq; void *npu; void *npu_matmul; } pi2_matmul_env;
size_t pi2_matmul_scratch(const pi2_mm *mm, int32_t n_mm, int32_t n_tok, int32_t impl);
void pi2_matmul(const pi2_matmul_env *env, const float *x, int32_t n_tok, const pi2_mm *mm, int32_t n_mm);
""")
lib = ffi.dlopen(_pi2.__file__)
IMPLS = {"auto": 0, "ref": 1, "base": 2}
ACTS = {"silu": 0, "gelu": 1, "relu": 2}


def _f32(a: np.ndarray):
    return ffi.from_buffer("float[]", a, require_writable=a.flags.writeable)


class Pool:
    """A C thread pool of n_threads (caller included); close() or use as a context manager."""

    def __init__(self, n_threads: int = 2):
        out = ffi.new("pi2_pool **")
        if lib.pi2_pool_create(n_threads, out) != 0:
            raise RuntimeError("pi2_pool_create failed")
        self.h, self.n_threads = out[0], n_threads

    def close(self):
        lib.pi2_pool_free(self.h)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def rms_norm(x: np.ndarray, w: np.ndarray | None, eps: float) -> np.ndarray:
    x = np.ascontiguousarray(x, np.float32)
    y = np.empty_like(x)
    lib.pi2_rms_norm(_f32(y), _f32(x), ffi.NULL if w is None else _f32(np.ascontiguousarray(w, np.float32)), x.size, eps)
    return y


def rope(x: np.ndarray, pos: int, n_rot: int, base: float, neox: bool) -> np.ndarray:
    """x (n_heads, head_dim) rotated at position pos (freq_scale 1, no freq factors)."""
    y = np.array(x, np.float32)
    cs = np.empty(n_rot, np.float32)
    lib.pi2_rope_cache(_f32(cs), pos, n_rot, base, 1.0, ffi.NULL)
    lib.pi2_rope(_f32(y), y.shape[0], y.shape[1], n_rot, _f32(cs), int(neox))
    return y


_gelu = []


def ffn_activate(g: np.ndarray, u: np.ndarray, act: str) -> np.ndarray:
    if not _gelu:
        t = np.empty(65536, np.uint16)
        lib.pi2_gelu_table(ffi.from_buffer("pi2_fp16[]", t, require_writable=True))
        _gelu.append(t)
    out = np.array(g, np.float32)
    lib.pi2_ffn_activate(_f32(out), _f32(np.ascontiguousarray(u, np.float32)), out.size, ACTS[act],
                         ffi.from_buffer("pi2_fp16[]", _gelu[0]))
    return out


def attention(pool: Pool, q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, pos0: int, scale: float,
              window: int = 0) -> np.ndarray:
    """q (n_tok, n_head, hd) float32 at positions pos0..; caches (n_ctx, n_head_kv, hd) float16 as
    reference.attention takes them. Returns (n_tok, n_head * hd_v)."""
    n_tok, n_head, hd = q.shape
    n_ctx, n_head_kv, hdv = v_cache.shape
    kT = np.ascontiguousarray(k_cache.astype(np.float32).transpose(1, 2, 0))     # [hkv][hd][n_ctx]
    v = np.ascontiguousarray(v_cache.astype(np.float32))
    q = np.ascontiguousarray(q, np.float32)
    out = np.empty((n_tok, n_head * hdv), np.float32)
    nt = pool.n_threads
    scores, qf = np.empty(nt * n_ctx, np.float32), np.empty(nt * hd, np.float32)
    acc = np.empty(nt * lib.pi2_attn_acc_floats(hd, hdv), np.float32)
    a = ffi.new("pi2_attn *", dict(q=_f32(q), k=_f32(kT), v=_f32(v), out=_f32(out), scores=_f32(scores), qf=_f32(qf),
                                   acc=_f32(acc), n_tok=n_tok, pos0=pos0, n_ctx=n_ctx, n_head=n_head,
                                   n_head_kv=n_head_kv, head_dim=hd, head_dim_v=hdv, window=window, scale=scale))
    lib.pi2_attention(pool.h, a)
    return out


def matmul(pool: Pool, raw: np.ndarray, qtype: int, n_in: int, x: np.ndarray, impl: str) -> np.ndarray:
    """(n_tok, n_out) = x (n_tok, n_in) times the rows of raw (n_out, row_bytes), through pi2_matmul."""
    raw = np.ascontiguousarray(raw, np.uint8)
    x = np.ascontiguousarray(x, np.float32)
    n_tok, n_out = x.shape[0], raw.shape[0]
    out = np.empty((n_tok, n_out), np.float32)
    w = ffi.new("pi2_weight *", dict(data=ffi.from_buffer(raw), type=qtype, n_in=n_in, n_out=n_out,
                                     row_bytes=raw.shape[1]))
    mm = ffi.new("pi2_mm *", dict(w=w, out=_f32(out)))
    scratch = np.empty(max(lib.pi2_matmul_scratch(mm, 1, n_tok, IMPLS[impl]), 1), np.uint8)
    env = ffi.new("pi2_matmul_env *", dict(pool=pool.h, impl=IMPLS[impl],
                                           xq=ffi.from_buffer("uint8_t[]", scratch, require_writable=True)))
    lib.pi2_matmul(env, _f32(x), n_tok, mm, 1)
    return out
