"""engine/context.py — CContext: a sequence evaluated by the C forward pass (KV cache, threads; the interface of
reference.ReferenceContext), its sparse FFN rule, its streamed FFN (the neuron cache and read pipeline), and decodes
that Ctrl-C can stop.

Does not: report their statistics (context_stats.py), choose a rule or a plan (pi2/runtime/ffn_rule.py,
pi2/plan/), or touch the NNAPI delegate (nnapi.py).
"""
from __future__ import annotations

import os
import threading
import time

import numpy as np

from pi2.engine import expert_clusters
from pi2.engine.flash_io import IDS as IO_IDS
from pi2.engine.kernels import impl_id
from pi2.engine.lib import check, enum, error_for, ffi, last_error, lib
from pi2.engine.context_stats import ContextStats
from pi2.engine.model import CModel
from pi2.errors import UnsupportedError, UsageError


def default_threads() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


_LONG_DECODE_BYTES = 1 << 30   # decodes reading more weight bytes than this run interruptibly
_ABORT_GRACE_S = 2.0            # how long Ctrl-C waits for a decode to stop before leaving it to its read
STUCK: list = []                # contexts whose decode did not stop (a read that never returns): never freed


class CContext(ContextStats):
    """A sequence evaluated by the C forward pass: decode(tokens, all_logits) -> logits, reset(),
    n_past, n_ctx; the same interface as reference.ReferenceContext. Ctrl-C during a decode stops it
    at the next layer boundary and raises KeyboardInterrupt (the cache stays as before the call)."""

    def __init__(self, cmodel: CModel, n_ctx: int, n_threads: int = 0, impl: str = "auto", n_batch: int = 512,
                 ctx_shift: bool = False, n_keep: int = 0, type_k: int = 1, flash_attn: bool = False,
                 type_v: int = 1):
        p = lib.pi2_ctx_default_params()
        p.n_ctx, p.n_batch, p.impl = n_ctx, n_batch, impl_id(impl)
        p.ctx_shift, p.n_keep, p.type_k = int(ctx_shift), n_keep, type_k
        p.flash_attn, p.type_v = int(flash_attn), type_v
        self.ctx_shift, self.n_keep = ctx_shift, n_keep
        p.n_threads = n_threads if n_threads > 0 else default_threads()
        out = ffi.new("pi2_ctx **")
        check(lib.pi2_ctx_init(cmodel._h, ffi.new("pi2_ctx_params *", p), out))
        self._h = ffi.gc(out[0], lib.pi2_ctx_free)
        self.cmodel, self.cfg = cmodel, cmodel.config        # the model must outlive the context
        self.n_ctx, self.n_threads = n_ctx, p.n_threads
        self._logits = np.empty(self.cfg.n_vocab, np.float32)
        self._trace_cb = None
        if self.cfg.expert_bundles:       # a converted MoE file: what its open clusters would cost to read
            expert_clusters.start(self)

    def __getattr__(self, name: str):
        # decode_from, on the MoE family only (llama-perplexity's rows: its last layer computes just those). Not a
        # bound method stored on the instance: that cycle kept the context and its model (mapping and repacked
        # copies) alive until the next garbage collection, so a second context (pi2 bench -t 1,2) doubled the RSS.
        cfg = self.__dict__.get("cfg")
        if name == "decode_from" and cfg is not None and cfg.moe_family:
            return self._decode_from
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def n_past(self) -> int:
        return lib.pi2_ctx_n_past(self._h)

    def reset(self) -> None:
        check(lib.pi2_ctx_truncate(self._h, 0))

    def truncate(self, n_keep: int) -> None:
        """Keep the first n_keep cached positions (0 <= n_keep <= n_past) and forget the rest."""
        check(lib.pi2_ctx_truncate(self._h, int(n_keep)))

    def set_trace(self, fn) -> None:
        """fn(name, layer, float32 array) at every checkpoint (None: off). For tests; slows decoding."""
        if fn is None:
            self._trace_cb = None
            lib.pi2_set_trace(self._h, ffi.NULL, ffi.NULL)
            return

        def tramp(name, layer, data, n, user):   # pi2_set_trace is a test entry point (pi2_test.h)
            fn(ffi.string(name).decode(), layer, np.frombuffer(ffi.buffer(data, n * 4), np.float32).copy())
        self._trace_cb = ffi.callback("pi2_trace_fn", tramp)
        lib.pi2_set_trace(self._h, self._trace_cb, ffi.NULL)

    _RULES = {**enum("PI2_FFN_", ("dense", "threshold", "topk", "relu")),   # sparse.FFNRule's names
              "predicted": lib.PI2_FFN_PREDICTED_GATE, "predictor": lib.PI2_FFN_PWRI_PREDICTOR}
    _PRED_KINDS = enum("PI2_PRED_", ("lowbit", "lowrank"))
    _PRED_INPUTS = {"ffn_norm": lib.PI2_PRED_INPUT_FFN_NORM, "attn_input": lib.PI2_PRED_INPUT_ATTN_NORM}

    def set_ffn(self, spec) -> None:
        """Compute FFN layers by `spec` (a sparse.FFNRule); zeroes the statistics."""
        relu = self.cfg.ffn_act in ("relu", "drelu") or (self.cfg.moe_family and self.cfg.expert_act == "relu")
        if spec.rule not in self._RULES or (spec.rule == "relu" and not relu):
            raise UnsupportedError(f"the C engine has no '{spec.rule}' FFN rule for this model yet")
        predicted = spec.rule == "predicted"
        zeros = np.zeros(self.cfg.n_layer)
        if spec.rule == "predictor":      # PowerInfer's one threshold, for every layer
            thr = np.full(self.cfg.n_layer, spec.threshold, np.float32)
        else:
            thr = np.ascontiguousarray(spec.thresholds if spec.thresholds is not None else zeros, np.float32)
        cuts = np.ascontiguousarray(spec.cuts if predicted else zeros, np.float32)
        p = ffi.new("pi2_ffn_params *", {"rule": self._RULES[spec.rule],
                                         "score_up": int(spec.score == "act_up" and not predicted),
                                         "keep": spec.keep or 1.0,
                                         "pred_kind": self._PRED_KINDS.get(spec.pred_kind, 0),
                                         "pred_input": self._PRED_INPUTS.get(spec.pred_input, 0)})
        p.thresholds = ffi.from_buffer("float[]", thr)
        p.pred_cuts = ffi.from_buffer("float[]", cuts)
        check(lib.pi2_ctx_set_ffn(self._h, p))
        self.ffn_spec = spec

    def set_stream(self, cluster: int, n_slots: int, n_hot=None, io: str = "pread", queue_depth: int = 32,
                   direct: bool = True, stream_gate: bool = False, n_gate_slots: int = 0, n_gate_hot=None,
                   n_early=None, n_expert_slots: int = 0, expert_hot=None, expert_ahead: bool = False,
                   expert_learn: bool = False, expert_cold_bytes: int = 0, expert_pre=None) -> None:
        """Serve the FFN bundles from a neuron cache (csrc/cache/, read by csrc/pipeline/): n_hot[L] resident neurons per layer, n_slots
        cold cluster slots of `cluster` neurons, reads by backend `io` (a resolved name, not auto). stream_gate: the
        gate rows too (two-phase loading under the predicted rule), n_gate_hot[L] resident, n_gate_slots slots.
        n_early[L]: cold clusters after the hot prefix a single token reads before the layer's attention.
        A MoE file streams its experts instead: n_expert_slots cold expert slots, expert_hot[L][X] (bool) resident
        experts, expert_ahead: guess the next layer's experts and read them ahead, expert_learn: learn hot experts
        while running (the cold slots of the most routed experts pinned, all but 2·k; cluster, n_slots and the gate
        settings are ignored), expert_cold_bytes > 0: the cold slots hold at most this many bytes read (a converted
        file's slot only its gate rows and the clusters read into it), the least recently used experts dropped;
        expert_pre[L][X]: a converted file's leading bundle clusters read with an expert's gate rows (two phases)."""
        L = self.cfg.n_layer
        hot = np.ascontiguousarray(np.zeros(L) if n_hot is None else n_hot, np.int32)
        ghot = np.ascontiguousarray(np.zeros(L) if n_gate_hot is None else n_gate_hot, np.int32)
        early = np.ascontiguousarray(np.zeros(L) if n_early is None else n_early, np.int32)
        self._stream_hot, self._stream_gate_hot, self._stream_early = hot, ghot, early
        self._stream_path = ffi.new("char[]", self.cmodel.path.encode())
        p = ffi.new("pi2_stream_params *", {"backend": IO_IDS[io], "queue_depth": queue_depth, "direct": int(direct),
                                            "cluster": cluster, "n_slots": n_slots, "stream_gate": int(stream_gate),
                                            "n_gate_slots": n_gate_slots})
        p.path = self._stream_path
        p.n_hot = ffi.from_buffer("int32_t[]", hot)
        p.n_gate_hot = ffi.from_buffer("int32_t[]", ghot)
        p.n_early = ffi.from_buffer("int32_t[]", early)
        p.n_expert_slots = n_expert_slots
        p.expert_ahead = int(expert_ahead)
        p.expert_learn = int(expert_learn)
        p.expert_cold_bytes = int(expert_cold_bytes)
        if expert_pre is not None:
            self._stream_expert_pre = np.ascontiguousarray(expert_pre, np.int32)
            p.expert_pre = ffi.from_buffer("int32_t[]", self._stream_expert_pre)
        if expert_hot is not None:
            self._stream_expert_hot = np.ascontiguousarray(expert_hot, np.uint8)
            p.expert_hot = ffi.from_buffer("uint8_t[]", self._stream_expert_hot)
        check(lib.pi2_ctx_set_stream(self._h, p))
        self.stream = {"cluster": cluster, "n_slots": n_slots, "io": io, "queue_depth": queue_depth,
                       "stream_gate": bool(stream_gate), "n_gate_slots": n_gate_slots if stream_gate else 0,
                       "n_expert_slots": n_expert_slots, "expert_cold_bytes": int(expert_cold_bytes)}
        self._stream_prev = None
        self.stream_stats()      # the figures start after the hot prefixes were read

    def _decode_from(self, tokens, first: int) -> np.ndarray:
        """A fresh chunk with the logits of tokens first.. only (n - first, n_vocab), as llama-perplexity asks."""
        self.reset()
        if not 0 < first < len(tokens):
            return self.decode(tokens, all_logits=True)[first:]
        return self.decode(tokens, all_logits=True, _first=first)

    def _shift_fits(self, n: int) -> bool:
        """Whether the context shift pi2_decode makes first leaves room for n tokens (csrc/forward.c's test)."""
        n_discard = (self.n_past - self.n_keep) // 2
        return n_discard > 0 and self.n_past - n_discard + n <= self.n_ctx

    def decode(self, tokens, all_logits: bool = False, _first: int = 0) -> np.ndarray:
        """Evaluate `tokens` after the cached ones; float32 logits of the last token (n_vocab,), or
        of every token (n_tok, n_vocab) when all_logits."""
        toks = np.ascontiguousarray(np.asarray(tokens, dtype=np.int64).reshape(-1).astype(np.int32))
        n = toks.size
        if n == 0:
            raise UsageError("nothing to decode")
        if self.n_past + n > self.n_ctx and not (self.ctx_shift and self._shift_fits(n)):
            raise UsageError(f"context full: {self.n_past} + {n} tokens > n_ctx {self.n_ctx}")
        out = np.empty((n - _first, self.cfg.n_vocab), np.float32) if all_logits else self._logits
        args = (self._h, ffi.from_buffer("int32_t[]", toks), n,
                ffi.from_buffer("float[]", out, require_writable=True), -_first if _first else int(all_logits))
        t0 = time.perf_counter()
        # a streamed decode reads the file: any read may stall, so it is always interruptible
        status, msg = self._interruptible(args, n * self.cmodel.n_bytes >= _LONG_DECODE_BYTES
                                          or bool(getattr(self, "stream", None)))
        self._decode_s = getattr(self, "_decode_s", 0.0) + time.perf_counter() - t0
        self._decoded = getattr(self, "_decoded", 0) + n
        if status == lib.PI2_ERR_ABORTED:
            raise KeyboardInterrupt
        if status < 0:
            raise error_for(status, *(msg[1:] if msg else ("",)))
        self.cmodel.model.file.check_io()     # what Python read of the file (thresholds, tables) was whole
        return out if all_logits else out.copy()

    def _interruptible(self, args, long: bool) -> tuple:
        """Run pi2_decode. A long one called from the main thread runs in a helper thread, so that
        Ctrl-C (which Python handles only in the main thread, between bytecodes) can call pi2_abort
        meanwhile; a short one (a token of a small model) is not worth the thread's ~50 us.
        The abort takes effect at a layer boundary; a decode blocked in a read that does not return (a stalled
        device: the kernel cannot cancel it) is left running after _ABORT_GRACE_S: the context goes into STUCK
        (never freed while it runs) and KeyboardInterrupt is raised, so the CLI says so and exits."""
        def call():   # the error record is the calling thread's: read it there
            st = lib.pi2_decode(*args)
            return st, (last_error() if st < 0 else None)
        if not long or threading.current_thread() is not threading.main_thread():
            return call()
        result, stop, finished = [], [], threading.Event()

        def helper():
            try:
                result.append(call() if not stop else (lib.PI2_ERR_ABORTED, None))
            finally:
                finished.set()
        th = threading.Thread(target=helper, name="pi2-decode", daemon=True)
        idle_since = None
        while True:   # Ctrl-C may land anywhere here, even inside start(): wait until the helper ends
            try:
                if th.ident is None and not stop:
                    th.start()
                if finished.wait(0.1):
                    break
                if stop and th.is_alive() and time.monotonic() - stop[0] > _ABORT_GRACE_S:
                    STUCK.append(self)      # its decode still uses the handle, the model and the slots
                    break
                if th.is_alive():
                    idle_since = None
                elif idle_since is None:
                    idle_since = time.monotonic()
                elif time.monotonic() - idle_since > 1.0:   # interrupted before the thread was created
                    break
            except KeyboardInterrupt:
                if not stop:
                    stop.append(time.monotonic())
                lib.pi2_abort(self._h)
        if stop:
            raise KeyboardInterrupt
        return result[0]
