"""cinternal.py — the C core's test entry points (csrc/pi2_test.h) for tests, with thin numpy wrappers.

pi2's extension binds pi2_test.h beside pi2.h (cffi API mode: declarations and layouts checked against C, none
exported from the module), so these call `pi2._pi2.lib` directly. Owns: the ops, attention and matmul wrappers, the
thread pool, the slot LRU, FlashFile with the reads one by one and the I/O test switches, the probe's test switches.
"""
from __future__ import annotations

import numpy as np

from pi2._pi2 import ffi, lib
from pi2.engine import check, flash_io

IMPLS = {"auto": lib.PI2_IMPL_AUTO, "ref": lib.PI2_IMPL_REF, "base": lib.PI2_IMPL_BASE}
ACTS = {"silu": lib.PI2_ACT_SILU, "gelu": lib.PI2_ACT_GELU, "relu": lib.PI2_ACT_RELU}
PROBE_TEST_SECCOMP_URING, PROBE_TEST_RAISE_SIGSYS = lib.PI2_IO_PROBE_TEST_SECCOMP_URING, lib.PI2_IO_PROBE_TEST_RAISE_SIGSYS
TEST_DIRECT_OPEN_EINVAL, TEST_DIRECT_READ_EINVAL = lib.PI2_IO_TEST_DIRECT_OPEN_EINVAL, lib.PI2_IO_TEST_DIRECT_READ_EINVAL


def _f32(a: np.ndarray):
    return ffi.from_buffer("float[]", a, require_writable=a.flags.writeable)


class Pool:
    """A C thread pool of n_threads (caller included); close() or use as a context manager."""

    def __init__(self, n_threads: int = 2):
        out = ffi.new("pi2_pool **")
        check(lib.pi2_pool_create(n_threads, out))
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
    check(lib.pi2_test_attention(pool.h, _f32(q), _f32(kT), _f32(v), _f32(out), n_tok, pos0, n_ctx, n_head, n_head_kv,
                                 hd, hdv, window, scale))
    return out


def matmul(pool: Pool, raw: np.ndarray, qtype: int, n_in: int, x: np.ndarray, impl: str) -> np.ndarray:
    """(n_tok, n_out) = x (n_tok, n_in) times the rows of raw (n_out, row_bytes), through pi2_matmul."""
    raw = np.ascontiguousarray(raw, np.uint8)
    x = np.ascontiguousarray(x, np.float32)
    n_tok, n_out = x.shape[0], raw.shape[0]
    out = np.empty((n_tok, n_out), np.float32)
    check(lib.pi2_test_matmul(pool.h, ffi.from_buffer(raw), qtype, n_in, n_out, raw.shape[1], _f32(x), n_tok,
                              _f32(out), IMPLS[impl]))
    return out


def matmul_packed(pool: Pool, raw: np.ndarray, packed: np.ndarray, qtype: int, n_in: int, x: np.ndarray,
                  impl: str) -> np.ndarray:
    """matmul with `packed` (pi2_repack_rows of raw) as the weight's packed copy: matmul.c's packed paths."""
    raw, packed = np.ascontiguousarray(raw, np.uint8), np.ascontiguousarray(packed, np.uint8)
    x = np.ascontiguousarray(x, np.float32)
    n_tok, n_out = x.shape[0], raw.shape[0]
    out = np.empty((n_tok, n_out), np.float32)
    check(lib.pi2_test_matmul_packed(pool.h, ffi.from_buffer(raw), ffi.from_buffer(packed), qtype, n_in, n_out,
                                     raw.shape[1], _f32(x), n_tok, _f32(out), IMPLS[impl]))
    return out


class Slots:
    """The neuron cache's slot LRU (csrc/cache/slots.c) of n_slots slots over n_layer layers of n_cl clusters."""

    def __init__(self, n_slots: int, n_layer: int, n_cl: int):
        out = ffi.new("pi2_test_slots **")
        check(lib.pi2_test_slots_new(n_slots, n_layer, n_cl, out))
        self.h = ffi.gc(out[0], lib.pi2_test_slots_free)
        self.n_slots, self.n_layer, self.n_cl = n_slots, n_layer, n_cl

    def find(self, il: int, cl: int) -> int:
        return lib.pi2_test_slots_find(self.h, il, cl)

    def take(self, il: int, cl: int) -> int:
        return lib.pi2_test_slots_take(self.h, il, cl)

    def forget(self, s: int) -> None:
        lib.pi2_test_slots_forget(self.h, s)

    def clear(self) -> None:
        lib.pi2_test_slots_clear(self.h)

    def pin(self, s: int) -> None:
        lib.pi2_test_slots_pin(self.h, s)

    def unpin(self, s: int) -> None:
        lib.pi2_test_slots_unpin(self.h, s)

    def check(self) -> int:
        return lib.pi2_test_slots_check(self.h)

    def poke(self, k: int, s: int) -> None:
        lib.pi2_test_slots_poke(self.h, k, s)

    def state(self) -> dict:
        """walk: the LRU list from head (at most n_slots entries; pinned slots are not in it), tail, held: (layer,
        cluster) or None per slot,
        slot_of: [n_layer * n_cl]."""
        order, tail = np.zeros(self.n_slots, np.int32), ffi.new("int32_t *")
        layer, cl = np.zeros(self.n_slots, np.int32), np.zeros(self.n_slots, np.int32)
        slot_of = np.zeros(self.n_layer * self.n_cl, np.int32)
        buf = lambda a: ffi.from_buffer("int32_t[]", a, require_writable=True)  # noqa: E731
        n = lib.pi2_test_slots_state(self.h, buf(order), tail, buf(layer), buf(cl), buf(slot_of))
        return {"walk": [int(i) for i in order[:n]], "tail": tail[0], "slot_of": slot_of,
                "held": [(int(a), int(b)) if a >= 0 else None for a, b in zip(layer, cl)]}


def probe(path, *, buffered: bool = False, test_flags: int = 0) -> flash_io.ProbeResult:
    """flash_io.probe with the probe's test switches (pi2_test_io_probe); the result is not kept."""
    return flash_io.probe(path, buffered=buffered,
                          _run=lambda p, f, out, chosen: lib.pi2_test_io_probe(p, f, test_flags, out, chosen))


class FlashFile(flash_io.FlashFile):
    """flash_io.FlashFile with the reads one by one (pi2_io_submit / reap / read_all), the page-cache drop, and the
    open's test switches (pi2_test_io_open's test_flags)."""

    def __init__(self, *args, test_flags: int = 0, **kw):
        self._test_flags = test_flags
        self._held: dict = {}     # user -> destination kept alive while in flight
        super().__init__(*args, **kw)

    def _open(self, path: bytes, params, handle, info) -> int:
        return lib.pi2_test_io_open(path, params, self._test_flags, handle, info)

    def close(self) -> None:
        super().close()
        self._held.clear()

    @staticmethod
    def _reqs(requests):
        reqs = ffi.new("pi2_io_request[]", max(len(requests), 1))
        for i, (offset, length, dest, user) in enumerate(requests):
            reqs[i].offset, reqs[i].length, reqs[i].user = offset, length, user
            reqs[i].dest = ffi.from_buffer(dest, require_writable=True)
        return reqs

    def submit(self, requests) -> int:
        """Queue (offset, length, dest buffer, user) requests; return how many were accepted."""
        h = self._handle()
        reqs = self._reqs(requests)
        n = ffi.new("int32_t *")
        check(lib.pi2_io_submit(h, reqs, len(requests), n))
        for offset, length, dest, user in requests[:n[0]]:
            self._held[user] = dest
        return n[0]

    def reap(self, max_n: int = 64, min_complete: int = 1) -> list:
        h = self._handle()
        out = ffi.new("pi2_io_completion[]", max(max_n, 1))
        n = ffi.new("int32_t *")
        check(lib.pi2_io_reap(h, out, max_n, min_complete, n))
        got = [flash_io.Completion(out[i].user, out[i].nbytes, out[i].error) for i in range(n[0])]
        for c in got:
            self._held.pop(c.user, None)
        return got

    @property
    def in_flight(self) -> int:
        return lib.pi2_io_in_flight(self._handle())

    def read_all(self, requests) -> list:
        """Completions of (offset, length, dest, user) requests, in request order."""
        h = self._handle()
        reqs = self._reqs(requests)
        out = ffi.new("pi2_io_completion[]", max(len(requests), 1))
        check(lib.pi2_io_read_all(h, reqs, len(requests), out))
        return [flash_io.Completion(out[i].user, out[i].nbytes, out[i].error) for i in range(len(requests))]

    def drop_cache(self) -> None:
        check(lib.pi2_io_drop_cache(self._handle()))
