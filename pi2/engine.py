"""engine.py — the only module that imports the compiled extension pi2._pi2.

Owns: loading the extension, the ABI check, turning C status codes into Pi2 exceptions, thin
numpy wrappers over the C kernels (dequantize, quantize_act, matvec) for tests and benchmarks, and
the C forward pass: CModel (a model's hyper-parameters and tensor descriptors handed to C) and
CContext (KV cache and threads; the interface of reference.ReferenceContext).
Does not: loop over weights in Python or decide anything about models; the NNAPI handles are in engine_nnapi.py.
Over 400 lines on purpose: it is the one module that touches pi2._pi2, so the ABI check and every cffi
conversion of model, context, stream and statistics live together.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np

from pi2.errors import EngineError, ModelFormatError, UnsupportedError, UsageError

ABI_VERSION = 10

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


def guard_mapping(buf, path: str, fd: int = -1) -> int:
    """Guard a read-only mapping (an mmap.mmap): a page of it that fails (SIGBUS) reads as zeros and check_mapping
    raises instead of the process dying. Returns the guard's id (-1: not guarded)."""
    return int(lib.pi2_map_guard_add(ffi.from_buffer(buf), len(buf), str(path).encode(), fd))


def check_mapping(gid: int) -> None:
    """Raise EngineError when the guarded mapping `gid` failed (or its file shrank)."""
    check(lib.pi2_map_guard_check(gid))


def unguard_mapping(gid: int) -> None:
    lib.pi2_map_guard_remove(gid)


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
    why = ffi.new("const char **")
    variant = ffi.string(lib.pi2_kernel_variant(why)).decode()
    packed = [n for n, tid in (("Q4_1", 3), ("Q5_0", 6), ("Q8_0", 8)) if _has_packed(tid)]
    return {"isa": [n for bit, n in _ISA_NAMES.items() if isa & bit], "vec_dot": types,
            "variant": variant, "variant_why": ffi.string(why[0]).decode(), "packed": packed}


def _has_packed(tid: int) -> bool:
    """Whether the auto table has a packed kernel for ggml type tid (8 zero rows of one block each)."""
    w, x, out = ffi.new("uint8_t[]", 8 * 64), ffi.new("uint8_t[]", 64), ffi.new("float[]", 8)
    return lib.pi2_matvec_packed(tid, w, 8, 32, x, out, 0) == 0


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
                                ffi.from_buffer("float[]", out, require_writable=True), _impl(impl)))
    return out


# ---- the forward pass: models and contexts ------------------------------------------------------

_ARCHS = {"llama": 0, "qwen2": 1, "gemma3": 2, "bamboo": 3}
_ACTS = {"silu": 0, "gelu": 1, "relu": 2, "drelu": 3}
_LAYER_ROLES = {   # blk.{il}.<name> -> pi2_tensor_role, and the ModelConfig flag that makes it present
    "attn_norm.weight": (4, None), "attn_q.weight": (5, None), "attn_k.weight": (6, None),
    "attn_v.weight": (7, None), "attn_output.weight": (8, None), "attn_q.bias": (9, "qkv_bias"),
    "attn_k.bias": (10, "qkv_bias"), "attn_v.bias": (11, "qkv_bias"), "attn_q_norm.weight": (12, "qk_norm"),
    "attn_k_norm.weight": (13, "qk_norm"), "post_attention_norm.weight": (14, "post_norms"),
    "ffn_norm.weight": (15, None), "ffn_gate.weight": (16, None), "ffn_up.weight": (17, None),
    "ffn_down.weight": (18, None), "post_ffw_norm.weight": (19, "post_norms"),
}


def model_params(cfg) -> dict:
    """pi2_model_params fields from a ModelConfig."""
    if cfg.arch not in _ARCHS:
        raise UnsupportedError(f"the C engine does not run {cfg.arch} models yet")
    return dict(arch=_ARCHS[cfg.arch], n_vocab=cfg.n_vocab, n_embd=cfg.n_embd, n_layer=cfg.n_layer, n_ff=cfg.n_ff,
                n_head=cfg.n_head, n_head_kv=cfg.n_head_kv, head_dim=cfg.head_dim, head_dim_v=cfg.head_dim_v,
                n_rot=cfg.n_rot, rms_eps=cfg.rms_eps, rope_base=cfg.rope_base, rope_base_local=cfg.rope_base_local,
                rope_freq_scale=cfg.rope_freq_scale, rope_neox=int(cfg.rope_neox), qkv_bias=int(cfg.qkv_bias),
                qk_norm=int(cfg.qk_norm), post_norms=int(cfg.post_norms), ffn_act=_ACTS[cfg.ffn_act],
                embd_scale=cfg.embd_scale, attn_scale=cfg.attn_scale, q_prescale=int(cfg.q_prescale),
                logit_softcap=cfg.logit_softcap, sliding_window=cfg.sliding_window, swa_period=cfg.swa_period)


_FFN_DOWN_ROWS = 20
_FFN_DOWN_SCALE = 24
_FFN_DOWN_COLSCALE = 25
_PRED_ROLES = {"ffn_gate_pred.weight": 21, "fc1.weight": 22, "fc2.weight": 23}   # pi2-made predictors
_LOWBIT_TYPES = {1: 1001, 2: 1002}     # PI2_T_LOWBIT1/2: pi2.h's type ids of low-bit gate rows


@dataclass(frozen=True)
class RowView:
    """Rows of one type inside a larger tensor (pi2 bundles): what a pi2_tensor_desc with a row stride says."""
    type: int
    ne: tuple
    offset: int
    nbytes: int
    row_stride: int


def _bundle_views(model, il: int) -> dict:
    """A pi2 file's gate (bundle-gud only), up and down rows of layer il as strided views of ffn_bundle."""
    from pi2.model.ffn_layout import bundle_layout, row_bytes
    cfg, t = model.config, model.tensor(f"blk.{il}.ffn_bundle.weight")
    lay, e, n = bundle_layout(model, il), cfg.n_embd, cfg.n_ff
    view = lambda qt, off: RowView(qt, (e, n), t.offset + off, (n - 1) * lay["width"] + row_bytes(qt, e),  # noqa: E731
                                   lay["width"])
    out = {"ffn_up.weight": view(lay["up_type"], lay["up_offset"]),
           "ffn_down_rows": view(lay["down_type"], lay["down_offset"])}
    if lay["gate_type"] is not None:
        out["ffn_gate.weight"] = view(lay["gate_type"], 0)
    return out


def _predictor_descs(model, il: int) -> list:
    """A pi2 file's pi2-made predictor tensors of layer il that are present: the low-bit gate copy (stored as I8
    rows, described with its PI2_T_LOWBIT type over n_embd values) or fc1/fc2."""
    kv, tensors, out = model.file.kv, model.file.tensors, []
    kind = kv.get("pi2.predictor.kind")
    names = ("ffn_gate_pred.weight",) if kind == "lowbit" else ("fc1.weight", "fc2.weight") if kind == "lowrank" else ()
    for name in names:
        t = tensors.get(f"blk.{il}.{name}")
        if t is None:
            continue
        if name == "ffn_gate_pred.weight":
            bits = int(kv.get("pi2.predictor.bits", 0))
            t = RowView(_LOWBIT_TYPES.get(bits, -1), (model.config.n_embd, t.ne[1]), t.offset, t.nbytes, 0)
        out.append((_PRED_ROLES[name], il, t))
    return out


def tensor_descs(model) -> list:
    """(role, layer, TensorInfo or RowView) of every tensor the forward pass reads; a tied output reuses
    token_embd; pi2 files describe their FFN rows inside the bundles, and their pi2-made predictor; PowerInfer
    files (and pi2 files made from them) their ffn_down_t as down rows and their predictor fc1/fc2."""
    cfg = model.config
    out = [(0, -1, model.tensor("token_embd.weight")), (1, -1, model.tensor("output_norm.weight")),
           (2, -1, model.tensor(model.output_name))]
    if model.rope_freqs:
        out.append((3, -1, model.tensor("rope_freqs.weight")))
    for il in range(cfg.n_layer):
        views = _bundle_views(model, il) if cfg.pi2 else {}
        for name, (role, flag) in _LAYER_ROLES.items():
            if cfg.ffn_down_t and name == "ffn_down.weight":          # PowerInfer: [n_ff] rows of n_embd
                out.append((_FFN_DOWN_ROWS, il, model.tensor(f"blk.{il}.ffn_down_t.weight")))
            elif cfg.pi2 and name == "ffn_down.weight":
                out.append((_FFN_DOWN_ROWS, il, views["ffn_down_rows"]))
                for suffix, role in (("scale", _FFN_DOWN_SCALE), ("colscale", _FFN_DOWN_COLSCALE)):
                    name = f"blk.{il}.ffn_down_{suffix}.weight"          # int8 rows' scales
                    if name in model.file.tensors:
                        out.append((role, il, model.tensor(name)))
            elif name in views:
                out.append((role, il, views[name]))
            elif flag is None or getattr(cfg, flag):
                out.append((role, il, model.tensor(f"blk.{il}.{name}")))
        if cfg.sparse:                                                 # PowerInfer's predictor
            out += [(_PRED_ROLES[n], il, model.file.tensors[f"blk.{il}.{n}"]) for n in ("fc1.weight", "fc2.weight")
                    if f"blk.{il}.{n}" in model.file.tensors]
        elif cfg.pi2:
            out += _predictor_descs(model, il)
    return out


def c_model_structs(model, descs: list | None = None) -> tuple:
    """The pi2_model_params and pi2_tensor_desc[] (cffi cdata) that pi2_model_load takes for `model`;
    `descs` overrides tensor_descs(model). Also serialised by tests for the aarch64 forward driver."""
    descs = tensor_descs(model) if descs is None else descs
    params = ffi.new("pi2_model_params *", model_params(model.config))
    arr = ffi.new("pi2_tensor_desc[]", max(len(descs), 1))
    for i, (role, layer, t) in enumerate(descs):
        ne = list(t.ne) + [1] * (4 - len(t.ne))
        arr[i] = {"role": role, "layer": layer, "type": t.type, "ne": ne, "offset": t.offset, "nbytes": t.nbytes,
                  "row_stride": getattr(t, "row_stride", 0)}
    return params, arr


class CModel:
    """A model loaded by the C core: the file mapped read-only in C, tensors checked against it."""

    def __init__(self, handle, config, path: str, n_bytes: int):
        self._h, self.config, self.path = handle, config, path
        self.n_bytes = n_bytes   # bytes of the tensors one token reads

    @classmethod
    def from_model(cls, model, descs: list | None = None) -> "CModel":
        """Describe `model` (a loader.Model) to C. `descs` overrides tensor_descs(model) (tests)."""
        descs = tensor_descs(model) if descs is None else descs
        params, arr = c_model_structs(model, descs)
        out = ffi.new("pi2_model **")
        check(lib.pi2_model_load(str(model.path).encode(), params, arr, len(descs), out))
        cm = cls(ffi.gc(out[0], lib.pi2_model_free), model.config, str(model.path),
                 sum(t.nbytes for _, _, t in descs))
        cm.model = model     # the file's tables: FFN rules and byte counts
        return cm

    def repack(self, ffn: bool = False, impl: str = "auto") -> int:
        """pi2_model_repack: the dense matrices (attention and output; the FFN too with ffn) copied into the
        packed kernels' layout, where table `impl` has packed kernels; the bytes all copies hold."""
        out = ffi.new("int64_t *")
        check(lib.pi2_model_repack(self._h, _impl(impl), int(ffn), out))
        self.repacked = int(out[0])
        return self.repacked


def stream_sizes(cmodel: CModel, cluster: int, layer: int = 0, n_hot: int = 0) -> dict:
    """pi2_stream_query: slot_bytes, min_slots, and layer's hot_bytes (n_hot neurons), bundle_bytes, layer_bytes; the
    same for its gate rows: gate_slot_bytes, gate_hot_bytes, gate_row_bytes, gate_layer_bytes."""
    out = ffi.new("pi2_stream_sizes *")
    check(lib.pi2_stream_query(cmodel._h, cluster, layer, n_hot, out))
    return {k: getattr(out, k) for k in ("slot_bytes", "min_slots", "hot_bytes", "bundle_bytes", "layer_bytes",
                                         "gate_slot_bytes", "gate_hot_bytes", "gate_row_bytes", "gate_layer_bytes")}


def _default_threads() -> int:
    import os
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


_LONG_DECODE_BYTES = 1 << 30   # decodes reading more weight bytes than this run interruptibly


class CContext:
    """A sequence evaluated by the C forward pass: decode(tokens, all_logits) -> logits, reset(),
    n_past, n_ctx; the same interface as reference.ReferenceContext. Ctrl-C during a decode stops it
    at the next layer boundary and raises KeyboardInterrupt (the cache stays as before the call)."""

    def __init__(self, cmodel: CModel, n_ctx: int, n_threads: int = 0, impl: str = "auto", n_batch: int = 512):
        p = lib.pi2_ctx_default_params()
        p.n_ctx, p.n_batch, p.impl = n_ctx, n_batch, _impl(impl)
        p.n_threads = n_threads if n_threads > 0 else _default_threads()
        out = ffi.new("pi2_ctx **")
        check(lib.pi2_ctx_init(cmodel._h, ffi.new("pi2_ctx_params *", p), out))
        self._h = ffi.gc(out[0], lib.pi2_ctx_free)
        self.cmodel, self.cfg = cmodel, cmodel.config        # the model must outlive the context
        self.n_ctx, self.n_threads = n_ctx, p.n_threads
        self._logits = np.empty(self.cfg.n_vocab, np.float32)
        self._trace_cb = None

    @property
    def n_past(self) -> int:
        return lib.pi2_ctx_n_past(self._h)

    def reset(self) -> None:
        lib.pi2_ctx_reset(self._h)

    def truncate(self, n_keep: int) -> None:
        """Keep the first n_keep cached positions (0 <= n_keep <= n_past) and forget the rest."""
        check(lib.pi2_ctx_truncate(self._h, int(n_keep)))

    def set_trace(self, fn) -> None:
        """fn(name, layer, float32 array) at every checkpoint (None: off). For tests; slows decoding."""
        if fn is None:
            self._trace_cb = None
            lib.pi2_set_trace(self._h, ffi.NULL, ffi.NULL)
            return

        def tramp(name, layer, data, n, user):
            fn(ffi.string(name).decode(), layer, np.frombuffer(ffi.buffer(data, n * 4), np.float32).copy())
        self._trace_cb = ffi.callback("pi2_trace_fn", tramp)
        lib.pi2_set_trace(self._h, self._trace_cb, ffi.NULL)

    _RULES = {"dense": 0, "threshold": 1, "topk": 2, "relu": 3, "predicted": 4, "predictor": 5}
    _PRED_KINDS = {"lowbit": 0, "lowrank": 1}
    _PRED_INPUTS = {"ffn_norm": 0, "attn_input": 1}

    def set_ffn(self, spec) -> None:
        """Compute FFN layers by `spec` (a sparse.FFNRule); zeroes the statistics."""
        if spec.rule not in self._RULES or (spec.rule == "relu" and self.cfg.ffn_act not in ("relu", "drelu")):
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

    def ffn_counts(self) -> tuple:
        """(tokens through the FFN, active neurons per layer summed over them) since set_ffn."""
        active = np.zeros(self.cfg.n_layer, np.int64)
        n = lib.pi2_ctx_ffn_stats(self._h, ffi.from_buffer("int64_t[]", active, require_writable=True))
        return int(n), active

    def ffn_predicted(self) -> np.ndarray:
        """Predicted neurons (|P|) per layer summed over the tokens since set_ffn (zeros but for rule predicted)."""
        out = np.zeros(self.cfg.n_layer, np.int64)
        lib.pi2_ctx_ffn_predicted(self._h, ffi.from_buffer("int64_t[]", out, require_writable=True))
        return out

    def bench_stats(self) -> dict:
        """Mean keep-fraction over (token, layer) and FFN weight bytes read per token (as SparseFFN.stats); for a
        streamed context also the neuron cache's figures since the previous call (stream_stats); the kernels' CPU
        variant and the bytes of repacked weights."""
        return {**self._ffn_stats(), **self.stream_stats(), "kernel_variant": kernel_info()["variant"],
                "repacked_bytes": getattr(self.cmodel, "repacked", 0)}

    def stream_stats(self) -> dict:
        """Streamed contexts: cache_hit_rate (needed bundle clusters found hot or cached), cold_hit_rate, flash bytes
        per token decoded (gate rows included), io_wait_share (of decode time), read_mbps (bytes read / time reads
        were outstanding), since the previous call; with streamed gate rows also gate_hit_rate (P's gate clusters
        found hot or cached), gate_flash_bytes_per_token, gate_cache_bytes and gate_hot_bytes; whole_layer_reads
        (regions read whole: batches, gate rows read whole) and whole_reads_ahead (the share submitted before
        their FFN). {} when not streamed."""
        st = self.cache_stats()
        if not st:
            return {}
        st["decode_s"], st["decoded"] = getattr(self, "_decode_s", 0.0), getattr(self, "_decoded", 0)
        prev = getattr(self, "_stream_prev", None) or {k: 0 for k in st}
        self._stream_prev = dict(st)
        d = {k: st[k] - prev[k] for k in st if not k.endswith(("arena_bytes", "hot_bytes"))}
        need, cold = d["hot"] + d["hits"] + d["misses"], d["hits"] + d["misses"]
        whole = d["layer_loads"] + d["gate_layer_loads"]   # regions read whole (batches, gate rows read whole)
        out = {"cache_hit_rate": round((d["hot"] + d["hits"]) / need, 4) if need else 1.0,
               "cold_hit_rate": round(d["hits"] / cold, 4) if cold else 1.0,
               "flash_bytes_per_token": int(d["bytes_read"] / d["decoded"]) if d["decoded"] else 0,
               "io_wait_share": round(d["io_wait_s"] / d["decode_s"], 4) if d["decode_s"] > 0 else 0.0,
               "read_mbps": round(d["bytes_read"] / d["read_s"] / 1e6, 1) if d["read_s"] > 0 else 0.0,
               "early_reads_per_token": round(d["early_reads"] / d["decoded"], 1) if d["decoded"] else 0.0,
               "early_unused": round(d["early_unused"] / d["early_reads"], 4) if d["early_reads"] else 0.0,
               "whole_layer_reads": whole,
               "whole_reads_ahead": round(d["layer_loads_ahead"] / whole, 4) if whole else 0.0,
               "cache_bytes": st["arena_bytes"], "hot_bytes": st["hot_bytes"],
               "memory_budget": getattr(getattr(self, "plan", None), "budget", 0)}
        if self.stream.get("stream_gate"):   # two-phase loading: the gate rows' share (included above)
            gneed = d["gate_hot"] + d["gate_hits"] + d["gate_misses"]
            out.update(gate_hit_rate=round((d["gate_hot"] + d["gate_hits"]) / gneed, 4) if gneed else 1.0,
                       gate_flash_bytes_per_token=int(d["gate_bytes_read"] / d["decoded"]) if d["decoded"] else 0,
                       gate_cache_bytes=st["gate_arena_bytes"], gate_hot_bytes=st["gate_hot_bytes"])
        return out

    def _ffn_stats(self) -> dict:
        """As SparseFFN.stats: ffn_keep, ffn_bytes_per_token, and ffn_predicted under the predicted rule."""
        from pi2.model.ffn_layout import bytes_touched, layer_bytes, predictor_bytes
        spec = getattr(self, "ffn_spec", None)
        model = getattr(self.cmodel, "model", None)
        if spec is None or model is None:
            return {}
        n, active = self.ffn_counts()
        predicted = spec.rule == "predicted"
        if not n:
            out = {"ffn_keep": 1.0 if spec.rule == "dense" else 0.0, "ffn_bytes_per_token": 0}
            return {**out, "ffn_predicted": 0.0} if predicted else out
        lbs = [layer_bytes(model, il) for il in range(self.cfg.n_layer)]
        n_pred = self.ffn_predicted() if predicted else [None] * len(lbs)
        if predicted:   # the predictor's own bytes, per token
            lbs = [(predictor_bytes(model, il, spec.pred_kind),) + lb[1:] for il, lb in enumerate(lbs)]
        total = sum(lb[3] for lb in lbs) * n
        out = {"ffn_keep": round(int(active.sum()) / total, 6),
               "ffn_bytes_per_token": int(round(sum(bytes_touched(spec.rule, lb, n, int(a), None if p is None else int(p))
                                                    for lb, a, p in zip(lbs, active, n_pred)) / n))}
        if predicted:
            out["ffn_predicted"] = round(int(np.sum(n_pred)) / total, 6)
        return out

    def set_stream(self, cluster: int, n_slots: int, n_hot=None, io: str = "pread", queue_depth: int = 32,
                   direct: bool = True, stream_gate: bool = False, n_gate_slots: int = 0, n_gate_hot=None,
                   n_early=None) -> None:
        """Serve the FFN bundles from a neuron cache (csrc/cache.c): n_hot[L] resident neurons per layer, n_slots
        cold cluster slots of `cluster` neurons, reads by backend `io` (a resolved name, not auto). stream_gate: the
        gate rows too (two-phase loading under the predicted rule), n_gate_hot[L] resident, n_gate_slots slots.
        n_early[L]: cold clusters after the hot prefix a single token reads before the layer's attention."""
        from pi2.flash_io import _IDS
        L = self.cfg.n_layer
        hot = np.ascontiguousarray(np.zeros(L) if n_hot is None else n_hot, np.int32)
        ghot = np.ascontiguousarray(np.zeros(L) if n_gate_hot is None else n_gate_hot, np.int32)
        early = np.ascontiguousarray(np.zeros(L) if n_early is None else n_early, np.int32)
        self._stream_hot, self._stream_gate_hot, self._stream_early = hot, ghot, early
        self._stream_path = ffi.new("char[]", self.cmodel.path.encode())
        p = ffi.new("pi2_stream_params *", {"backend": _IDS[io], "queue_depth": queue_depth, "direct": int(direct),
                                            "cluster": cluster, "n_slots": n_slots, "stream_gate": int(stream_gate),
                                            "n_gate_slots": n_gate_slots})
        p.path = self._stream_path
        p.n_hot = ffi.from_buffer("int32_t[]", hot)
        p.n_gate_hot = ffi.from_buffer("int32_t[]", ghot)
        p.n_early = ffi.from_buffer("int32_t[]", early)
        check(lib.pi2_ctx_set_stream(self._h, p))
        self.stream = {"cluster": cluster, "n_slots": n_slots, "io": io, "queue_depth": queue_depth,
                       "stream_gate": bool(stream_gate), "n_gate_slots": n_gate_slots if stream_gate else 0}
        self._stream_prev = None
        self.stream_stats()      # the figures start after the hot prefixes were read

    _CACHE_STATS = ("tokens", "hot", "hits", "misses", "reads", "bytes_read", "layer_loads", "io_wait_s", "read_s",
                    "arena_bytes", "hot_bytes", "gate_hot", "gate_hits", "gate_misses", "gate_bytes_read",
                    "gate_layer_loads", "gate_arena_bytes", "gate_hot_bytes", "early_reads", "early_unused",
                    "layer_loads_ahead")

    def cache_stats(self) -> dict:
        """The neuron cache's counters (pi2_cache_stats as a dict); {} when the context is not streamed."""
        if not getattr(self, "stream", None):
            return {}
        st = ffi.new("pi2_cache_stats *")
        check(lib.pi2_ctx_cache_stats(self._h, st))
        return {k: getattr(st, k) for k in self._CACHE_STATS}

    def decode(self, tokens, all_logits: bool = False) -> np.ndarray:
        """Evaluate `tokens` after the cached ones; float32 logits of the last token (n_vocab,), or
        of every token (n_tok, n_vocab) when all_logits."""
        toks = np.ascontiguousarray(np.asarray(tokens, dtype=np.int64).reshape(-1).astype(np.int32))
        n = toks.size
        if n == 0:
            raise UsageError("nothing to decode")
        if self.n_past + n > self.n_ctx:
            raise UsageError(f"context full: {self.n_past} + {n} tokens > n_ctx {self.n_ctx}")
        out = np.empty((n, self.cfg.n_vocab), np.float32) if all_logits else self._logits
        args = (self._h, ffi.from_buffer("int32_t[]", toks), n,
                ffi.from_buffer("float[]", out, require_writable=True), int(all_logits))
        t0 = time.perf_counter()
        status, msg = self._interruptible(args, n * self.cmodel.n_bytes >= _LONG_DECODE_BYTES)
        self._decode_s = getattr(self, "_decode_s", 0.0) + time.perf_counter() - t0
        self._decoded = getattr(self, "_decoded", 0) + n
        if status == lib.PI2_ERR_ABORTED:
            raise KeyboardInterrupt
        if status < 0:
            raise _ERRORS.get(status, EngineError)(msg or f"C core error {status}")
        self.cmodel.model.file.check_io()     # what Python read of the file (thresholds, tables) was whole
        return out if all_logits else out.copy()

    def _interruptible(self, args, long: bool) -> tuple:
        """Run pi2_decode. A long one called from the main thread runs in a helper thread, so that
        Ctrl-C (which Python handles only in the main thread, between bytecodes) can call pi2_abort
        meanwhile; a short one (a token of a small model) is not worth the thread's ~50 us."""
        def call():
            st = lib.pi2_decode(*args)
            return st, (ffi.string(lib.pi2_last_error()).decode("utf-8", "replace") if st < 0 else "")
        if not long or threading.current_thread() is not threading.main_thread():
            return call()
        result, stop, finished = [], [], threading.Event()

        def helper():
            try:
                result.append(call() if not stop else (lib.PI2_ERR_ABORTED, ""))
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
                if th.is_alive():
                    idle_since = None
                elif idle_since is None:
                    idle_since = time.monotonic()
                elif time.monotonic() - idle_since > 1.0:   # interrupted before the thread was created
                    break
            except KeyboardInterrupt:
                stop.append(True)
                lib.pi2_abort(self._h)
        if stop:
            raise KeyboardInterrupt
        return result[0]


def decode_multi(ctxs, tokens) -> np.ndarray:
    """One token of each of several CContexts of one model in one step (pi2_decode_multi): the matrix products
    share one pass over the weights, each token attends to its own context. Logits (n, n_vocab), row t equal to
    ctxs[t].decode([tokens[t]]). For dense, unstreamed contexts; the first context's threads do the work."""
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
    if status < 0:
        raise _ERRORS.get(status, EngineError)(ffi.string(lib.pi2_last_error()).decode("utf-8", "replace"))
    return out
