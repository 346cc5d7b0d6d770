"""engine/nnapi.py — the NNAPI delegate's handles over the compiled extension (csrc/nnapi/).

Owns: NnapiDelegate (libneuralnetworks.so opened at run time, its devices and notes), NnapiGraph (a compiled
FULLY_CONNECTED graph: start/wait/run; the graph API is a test entry point, pi2_test.h), and attaching a delegate
to a CContext for prompt batches (ctx_set_nnapi) or decode's hot prefix (ctx_set_npu_ffn), with their statistics.
Does not: decide whether a run uses the NPU (pi2/runtime/npu.py, pi2/plan/npu_plan.py).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from pi2.engine.kernels import type_info
from pi2.engine.lib import check, ffi, lib
from pi2.engine.model import ACTS

if TYPE_CHECKING:
    from pi2.engine.context import CContext


NNAPI_DEVICE_TYPES = {0: "unknown", 1: "other", 2: "cpu", 3: "gpu", 4: "accelerator"}   # NNAPI's DeviceTypeCode


def _matrix(m) -> tuple:
    """A pi2_nnapi_matrix (and the buffer it points into) from a float32 2-D array, or from a tuple
    (raw uint8 rows, ggml type id, n_cols) of quantized rows."""
    if isinstance(m, tuple):
        raw, qtype, n_cols = m
        raw = np.ascontiguousarray(raw, dtype=np.uint8)
        rb = type_info(qtype).row_bytes(n_cols)
        raw = raw.reshape(-1, rb)
        desc = {"data": ffi.from_buffer(raw), "type": int(qtype), "n_rows": raw.shape[0], "n_cols": n_cols,
                "row_bytes": rb}
        return desc, raw
    a = np.ascontiguousarray(m, dtype=np.float32)
    if a.ndim != 2:
        raise ValueError("a weight matrix is 2-D (rows, cols)")
    desc = {"data": ffi.from_buffer(a), "type": 0, "n_rows": a.shape[0], "n_cols": a.shape[1],
            "row_bytes": a.shape[1] * 4}
    return desc, a


class NnapiGraph:
    """A compiled-per-batch-size NNAPI graph: start(x) returns at once, wait() gives the outputs, or None
    when the delegate failed (the caller computes on the CPU; the graph is not used again)."""

    def __init__(self, handle, delegate, n_in: int, n_out: list, keep: list):
        self._h, self.delegate, self.n_in, self.n_out = handle, delegate, n_in, n_out
        self._keep = keep           # the source buffers stay alive as long as the graph (copies are made)
        self._pending = None

    @property
    def bytes(self) -> int:
        return lib.pi2_nnapi_graph_bytes(self._h)

    def start(self, x) -> bool:
        x = np.ascontiguousarray(np.atleast_2d(np.asarray(x, dtype=np.float32)))
        if x.shape[1] != self.n_in:
            raise ValueError(f"input has {x.shape[1]} values per row, the graph takes {self.n_in}")
        outs = [np.empty((x.shape[0], n), np.float32) for n in self.n_out]
        ptrs = ffi.new("float *[]", [ffi.from_buffer("float[]", o, require_writable=True) for o in outs])
        st = lib.pi2_nnapi_start(self._h, ffi.from_buffer("float[]", x), x.shape[0], ptrs)
        if st == lib.PI2_ERR_UNSUPPORTED:
            return False
        check(st)
        self._pending = (outs, ptrs)
        return True

    def wait(self):
        if self._pending is None:
            return None
        outs, self._pending = self._pending[0], None
        st = lib.pi2_nnapi_wait(self._h)
        if st == lib.PI2_ERR_UNSUPPORTED:
            return None
        check(st)
        return outs

    def run(self, x):
        return self.wait() if self.start(x) else None


class NnapiDelegate:
    """libneuralnetworks.so opened at run time. Raises UnsupportedError (with the reason) when the
    library or a function it needs is missing."""

    def __init__(self, lib_path: str | None = None, accelerators_only: bool = False, f16: bool = True,
                 max_shapes: int = 4, batch_matmul: bool = False):
        self._path = ffi.new("char[]", lib_path.encode()) if lib_path else ffi.NULL
        p = ffi.new("pi2_nnapi_params *", {"accelerators_only": int(accelerators_only), "weight_type": int(f16),
                                           "max_shapes": max_shapes, "batch_matmul": int(batch_matmul)})
        p.lib_path = self._path
        out = ffi.new("pi2_nnapi **")
        check(lib.pi2_nnapi_open(p, out))
        self._h = ffi.gc(out[0], lib.pi2_nnapi_close)

    def _info(self):
        out = ffi.new("pi2_nnapi_info *", {"size": ffi.sizeof("pi2_nnapi_info")})
        check(lib.pi2_nnapi_get_info(self._h, out))
        return out

    @property
    def runtime_feature_level(self) -> int:
        return self._info().runtime_feature_level

    def devices(self) -> list:
        info = self._info()
        return [{"name": ffi.string(d.name).decode("utf-8", "replace"),
                 "type": NNAPI_DEVICE_TYPES.get(d.type, str(d.type)),
                 "feature_level": d.feature_level, "selected": bool(d.selected)}
                for d in (info.devices[i] for i in range(info.n_devices))]

    def notes(self) -> list:
        return [s for s in ffi.string(self._info().notes).decode("utf-8", "replace").split("\n") if s]

    def bench_ffn(self, act: str, n_embd: int, n_hot: int, runs: int = 5) -> float | None:
        """Seconds of the fastest of `runs` runs of a hot-FFN graph of n_hot random neurons (after the compiling
        run), None when the graph fails (pi2_nnapi_bench_ffn)."""
        best = ffi.new("double *")
        st = lib.pi2_nnapi_bench_ffn(self._h, ACTS[act], n_embd, n_hot, runs, best)
        if st == lib.PI2_ERR_UNSUPPORTED:
            return None
        check(st)
        return best[0]

    def _graph(self, fn, *args):   # the graph API is pi2_test.h's (tests run graphs directly)
        out = ffi.new("pi2_nnapi_graph **")
        check(fn(self._h, *args, out))
        return ffi.gc(out[0], lib.pi2_nnapi_graph_free)

    def fc(self, matrices: list) -> NnapiGraph:
        """out_i = x · w_iᵀ for matrices sharing their width (float32 arrays or (raw, type, n_cols))."""
        descs = [_matrix(m) for m in matrices]
        arr = ffi.new("pi2_nnapi_matrix[]", [d for d, _ in descs])
        h = self._graph(lib.pi2_nnapi_fc_create, arr, len(descs))
        return NnapiGraph(h, self, descs[0][0]["n_cols"], [d["n_rows"] for d, _ in descs], [self])

    def ffn(self, act: str, gate, up, down, n_hot: int, down_t: bool = False) -> NnapiGraph:
        """The hot prefix (first n_hot neurons) of an FFN layer: down_hot · (act(gate_hot·x) * (up_hot·x)).
        down is ffn_down [n_embd][n_ff], or ffn_down_t [n_ff][n_embd] with down_t."""
        g, u, d = (_matrix(m) for m in (gate, up, down))
        ptrs = [ffi.new("pi2_nnapi_matrix *", m[0]) for m in (g, u, d)]
        h = self._graph(lib.pi2_nnapi_ffn_create, ACTS[act], *ptrs, int(down_t), n_hot)
        return NnapiGraph(h, self, g[0]["n_cols"], [g[0]["n_cols"]], [self])


def ctx_set_nnapi(ctx: "CContext", delegate: NnapiDelegate | None, min_batch: int = 2) -> None:
    """Hand ctx's prompt-batch matrix products to `delegate` (None detaches). Raises UnsupportedError
    when no graph can be made (no device selected); the context then stays on the CPU."""
    check(lib.pi2_ctx_set_nnapi(ctx._h, lib.PI2_NNAPI_BATCHES, delegate._h if delegate else ffi.NULL, min_batch, ffi.NULL))
    ctx._nnapi = delegate           # the delegate outlives the context's graphs


def ctx_nnapi_stats(ctx: "CContext") -> dict:
    st = ctx.stats()
    return {"bytes": st["nnapi_bytes"], "runs": st["nnapi_runs"], "fallbacks": st["nnapi_fallbacks"]}


def ctx_set_npu_ffn(ctx: "CContext", delegate: NnapiDelegate | None, n_hot=None) -> None:
    """Hand the hot prefix of ctx's single-token decode (n_hot[il] neurons of each layer) to `delegate`
    (None detaches). Raises Pi2Error when nothing could be attached; the context then stays on the CPU."""
    if delegate is None:
        check(lib.pi2_ctx_set_nnapi(ctx._h, lib.PI2_NNAPI_HOT, ffi.NULL, 0, ffi.NULL))
        return
    hot = np.ascontiguousarray(n_hot, dtype=np.int32)
    if hot.shape != (ctx.cfg.n_layer,):
        raise ValueError(f"n_hot needs one count per layer ({ctx.cfg.n_layer})")
    check(lib.pi2_ctx_set_nnapi(ctx._h, lib.PI2_NNAPI_HOT, delegate._h, 0, ffi.from_buffer("int32_t[]", hot)))
    ctx._nnapi = delegate           # the delegate outlives the context's graphs
    ctx.npu_hot = [int(h) for h in hot]


def ctx_npu_ffn_stats(ctx: "CContext") -> dict:
    st = ctx.stats()
    return {"bytes": st["hot_bytes"], "runs": st["hot_runs"], "fallbacks": st["hot_fallbacks"]}
