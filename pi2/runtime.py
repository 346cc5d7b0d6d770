"""runtime.py — opening a model and an evaluation context for a chosen engine, with the run's settings.

Owns: engine selection (`c`, the compiled forward pass, which `auto` picks; `reference`, the numpy
specification; `auto` falls back to it for what the C engine cannot run yet), the context size rule
(-c 0 = the model's training context; default 4096 capped at it), the memory a run may use when no
--memory-budget is given (a pi2 file larger than it streams within it; a plain GGUF runs from its mapping with
a note), and prompt preparation.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, replace

from pi2.errors import UsageError
from pi2.model.loader import Model, load_model

ENGINES = ("auto", "c", "reference")
DEFAULT_CTX = 4096


@dataclass(frozen=True)
class RunConfig:
    n_ctx: int = DEFAULT_CTX      # 0 = the model's training context
    n_threads: int = 0            # 0 = all cores
    engine: str = "auto"
    keep: float | None = None     # --keep: model-wide mean FFN keep-fraction (None = the file's default)
    dense: bool = False           # --dense: every FFN neuron
    npu: str = "auto"             # --npu auto | nnapi | off (pi2/npu.py)
    nnapi_lib: str | None = None  # --nnapi-lib: libneuralnetworks.so to open (None = the system's)
    memory_budget: int | None = None  # --memory-budget in bytes: stream the FFN bundles (pi2/plan/budget.py)
    io: str = "auto"              # --io: the backend of streamed reads
    predictor: bool = True        # --no-predictor: a pi2 file's pi2-made predictor is not used
    npu_gbps: float | None = None  # --npu-gbps: the NPU's throughput to plan with (None = measured)
    repack: bool = True           # copy dense matrices into the packed kernels' layout at load (pi2_model_repack)


_NOTED: list = []
_FIT_NOTED: set = set()     # files whose does-not-fit note was printed (once per process)


def is_sparse_run(model: Model, cfg: RunConfig) -> bool:
    """Runs that need the sparse FFN: PowerInfer and pi2 files (unless --dense), or --keep below 1."""
    c = model.config
    if cfg.dense:
        return c.pi2 or c.ffn_down_t or c.sparse     # their FFN layout still needs the sparse FFN's reading
    return c.sparse or c.pi2 or c.ffn_down_t or (cfg.keep is not None and cfg.keep < 1.0)


def c_engine_gap(model: Model, cfg: RunConfig) -> str:
    """Why the C engine cannot run this model with these settings ("" when it can). It runs every architecture
    ModelConfig accepts, PowerInfer `PWRI` files (predictor, ffn_down_t, ReGLU and bamboo's dReLU) included."""
    c = model.config
    if c.arch not in ("llama", "qwen2", "gemma3", "bamboo"):
        return f"the C engine does not run {c.arch} models"
    return ""


def resolve_ctx(model: Model, n_ctx: int) -> int:
    """-c 0 is the model's training context; the default (4096) is capped at it; other sizes are as given."""
    if n_ctx < 0:
        raise UsageError(f"invalid context size {n_ctx}")
    train = model.config.n_ctx_train
    if n_ctx == 0:
        return train
    return min(n_ctx, train) if n_ctx == DEFAULT_CTX else n_ctx


def open_context(model: Model, cfg: RunConfig):
    """A fresh evaluation context on `model` for the configured engine."""
    if cfg.engine not in ENGINES:
        raise UsageError(f"unknown engine '{cfg.engine}' (choose from {', '.join(ENGINES)})")
    if cfg.keep is not None and not 0.0 < cfg.keep <= 1.0:
        raise UsageError(f"invalid --keep {cfg.keep:g}: a fraction of the FFN neurons in (0, 1]")
    n_ctx = resolve_ctx(model, cfg.n_ctx)
    from pi2 import npu
    npu.check_mode(cfg.npu)
    gap = c_engine_gap(model, cfg) if is_sparse_run(model, cfg) else ""
    if cfg.engine == "c" and gap:
        raise UsageError(f"{gap}: the C engine cannot run it", hint="use --engine reference (or auto)")
    if cfg.memory_budget is None and cfg.engine != "reference" and not gap:
        cfg = _fit_memory(model, cfg, n_ctx)
    if cfg.memory_budget is not None and not model.config.pi2:
        print("pi2: note: a plain GGUF runs from its mapping and --memory-budget is not enforced; "
              "`pi2 convert` makes a pi2 file whose FFN streams within the budget", file=sys.stderr)
    elif cfg.memory_budget is not None:
        if gap or cfg.engine == "reference":
            raise UsageError("--memory-budget needs the C engine" + (f" ({gap})" if gap else ""))
        return _streamed_context(model, cfg, n_ctx)
    if cfg.engine == "c" or (cfg.engine == "auto" and not gap):
        from pi2.engine import CContext, CModel
        from pi2.sparse import choose_rule
        rule = choose_rule(model, cfg.keep, cfg.dense, use_predictor=cfg.predictor)   # checks a predictor's tensors
        ctx = CContext(CModel.from_model(model), n_ctx, cfg.n_threads)
        ctx.set_ffn(rule)
        if cfg.repack:   # in memory: attention and output, and the FFN when every neuron is computed
            ctx.cmodel.repack(ffn=rule.rule == "dense")
        npu.attach(ctx, cfg.npu, cfg.nnapi_lib, model, cfg.npu_gbps)
        return ctx
    if cfg.engine == "auto" and not _NOTED:
        _NOTED.append(True)
        print(f"pi2: note: {gap}", file=sys.stderr)
    from pi2.reference import ReferenceContext
    ctx = ReferenceContext(model, n_ctx, keep=cfg.keep, dense=cfg.dense, predictor=cfg.predictor)
    npu.no_c_engine(ctx, cfg.npu)
    return ctx


def _fit_memory(model: Model, cfg: RunConfig, n_ctx: int) -> RunConfig:
    """No --memory-budget: a run uses what the file needs, capped by the memory the process may use
    (devices.memory_limit). A pi2 file that does not fit streams within that limit (its budget); a plain GGUF runs
    from its mapping (the kernel reads weights back in as they are evicted; its read-ahead is kept: the dense
    matmuls scan each matrix in order) and gets a note suggesting `pi2 convert`."""
    from pi2.devices import memory_limit
    from pi2.plan.budget import MARGIN, context_bytes, fmt, runtime_rss, streamable
    limit = memory_limit()
    if limit is None:
        return cfg
    kv, scratch = context_bytes(model.config, n_ctx, max(cfg.n_threads, 1))
    need = os.path.getsize(model.path) + kv + scratch + runtime_rss(model) + MARGIN
    if need <= limit:
        return cfg
    name = os.path.basename(model.path)
    first = name not in _FIT_NOTED
    _FIT_NOTED.add(name)
    if model.config.pi2 and not streamable(model):
        if first:
            print(f"pi2: note: {name} needs {fmt(need)} but this process may use {fmt(limit)}: its FFN streams "
                  f"from flash within that (as --memory-budget {limit >> 20}M)", file=sys.stderr)
        return replace(cfg, memory_budget=limit)
    if first:
        print(f"pi2: note: {name} needs {fmt(need)} but this process may use {fmt(limit)}: it runs from its mapping, "
              "re-reading weights from flash as they are evicted (slow); `pi2 convert` makes a pi2 file whose FFN "
              "streams only the neurons each token needs", file=sys.stderr)
    return cfg


def _streamed_context(model: Model, cfg: RunConfig, n_ctx: int):
    """A C context whose FFN bundles come from the neuron cache the budget leaves room for (and its gate rows, when
    the run uses the file's predictor: two-phase loading); with the NPU on, its copies of the hot prefix are part of
    the fixed region and the cache keeps no hot prefix of its own."""
    from pi2 import flash_io, npu
    from pi2.engine import CContext, CModel, _default_threads
    from pi2.plan.budget import make_plan, streamable
    from pi2.sparse import choose_rule
    why = streamable(model)
    if why:
        raise UsageError(why)
    backend, _ = flash_io.resolve(cfg.io, model.path)
    model.tokenizer      # built now, so that the runtime the plan measures includes it
    rule = choose_rule(model, cfg.keep, cfg.dense, use_predictor=cfg.predictor)
    cm = CModel.from_model(model)
    threads = cfg.n_threads if cfg.n_threads > 0 else _default_threads()
    plan = make_plan(model, cm, cfg.memory_budget, n_ctx, threads, io=backend, rule=rule)
    ctx = CContext(cm, n_ctx, threads)
    ctx.set_ffn(rule)
    if cfg.repack:   # the fixed region's attention and output: copies replace their mapped pages (same bytes)
        plan.repacked = cm.repack(ffn=False)
    npu.attach(ctx, cfg.npu, cfg.nnapi_lib, model, cfg.npu_gbps, room=cfg.memory_budget - plan.floor)
    if ctx.npu_state == "nnapi":
        plan = make_plan(model, cm, cfg.memory_budget, n_ctx, threads, io=backend, runtime=plan.runtime,
                         npu=ctx.npu_plan, rule=rule)
    ctx.set_stream(**plan.stream_args())
    ctx.plan = plan
    return ctx


def open_model(path) -> Model:
    return load_model(path)


def _strtol2(two: bytes):
    """strtol(two, &end, 16) on a 2-char buffer, as llama.cpp calls it for \\xHH: the value if it consumed
    both chars (two hex digits, or one hex digit after a space or a sign), else None."""
    hexd = b"0123456789abcdefABCDEF"
    if len(two) == 2 and two[0] in hexd and two[1] in hexd:
        return int(two, 16)
    if len(two) == 2 and two[0] in b" \t\n\v\f\r+-" and two[1] in hexd:
        v = int(two[1:], 16)
        return -v if two[0] == ord("-") else v
    return None


def process_escapes(s: str) -> str:
    """llama.cpp's string_process_escapes: \\n \\r \\t \\' \\" \\\\ and \\xHH (a raw byte); other escapes
    and a trailing backslash stay as written. Works on the UTF-8 bytes; non-UTF-8 results are surrogates."""
    b = s.encode("utf-8", "surrogateescape")
    out = bytearray()
    i, n = 0, len(b)
    simple = {ord("n"): b"\n", ord("r"): b"\r", ord("t"): b"\t", ord("'"): b"'", ord('"'): b'"', ord("\\"): b"\\"}
    while i < n:
        c = b[i]
        if c == 0x5C and i + 1 < n:
            i += 1
            e = b[i]
            v = _strtol2(b[i + 1:i + 3]) if e == ord("x") and i + 2 < n else None
            if e in simple:
                out += simple[e]
            elif v is not None:
                out.append(v & 0xFF)
                i += 2
            else:
                out += b"\\" + bytes([e])
        else:
            out.append(c)
        i += 1
    return out.decode("utf-8", "surrogateescape")
