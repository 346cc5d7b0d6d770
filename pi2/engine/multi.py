"""multi.py — pi2_decode_multi: one token of each of several contexts of one model in one step (a server's busy
slots): the matrix products share one pass over the weights, each token attends to its own context's cache."""
from __future__ import annotations

import time

import numpy as np

from pi2.engine.context import CContext
from pi2.engine.lib import check, ffi, lib
from pi2.errors import UsageError


def decode_multi(ctxs: list[CContext], tokens) -> np.ndarray:
    """Logits (n, n_vocab), row t equal bit for bit to ctxs[t].decode([tokens[t]]). For dense, unstreamed contexts
    without experts; the first context's threads do the work. Ctrl-C (pi2_abort) raises KeyboardInterrupt."""
    n = len(ctxs)
    toks = np.ascontiguousarray(np.asarray(tokens, dtype=np.int64).reshape(-1).astype(np.int32))
    if n == 0 or toks.size != n:
        raise UsageError("decode_multi needs one token per context")
    out = np.empty((n, ctxs[0].cfg.n_vocab), np.float32)
    handles = ffi.new("pi2_ctx *[]", [c._h for c in ctxs])
    t0 = time.perf_counter()
    status = lib.pi2_decode_multi(handles, ffi.from_buffer("int32_t[]", toks), n,
                                  ffi.from_buffer("float[]", out, require_writable=True))
    dt = (time.perf_counter() - t0) / n
    for c in ctxs:
        c._decode_s = getattr(c, "_decode_s", 0.0) + dt
        c._decoded = getattr(c, "_decoded", 0) + 1
    if status == lib.PI2_ERR_ABORTED:
        raise KeyboardInterrupt
    check(status)
    return out
