"""plan.py — plan_run: every decision a run takes before its context exists, one function for `pi2 run` (and chat,
perplexity, bench, the Python API) and `pi2 plan`.

Owns: the engine (`c`, the compiled forward pass, which `auto` picks; `reference`, the numpy specification, which
`auto` falls back to for what C cannot run), the context size rule (-c 0 = the model's training context; the
default 4096 capped at it), the threads, the FFN's active-set rule, the memory a run may use when no
--memory-budget is given (a pi2 file larger than it streams within it; a plain GGUF runs from its mapping with a
note), the neuron cache's split of a budget (pi2/plan/budget.py), the I/O backend, and NNAPI (pi2/runtime/npu.py).
Does not: create the context (pi2/runtime/session.py) or print (the notes it collects are printed by the session).
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

from pi2.engine import CModel, default_threads, flash_io
from pi2.errors import ModelFormatError, UnsupportedError, UsageError
from pi2.model.gguf_split import file_parts
from pi2.model.loader import Model
from pi2.plan import devices
from pi2.plan.budget import MARGIN, Plan, context_bytes, fmt, make_plan, runtime_rss, streamable
from pi2.plan.experts import ExpertPlan, expert_gap, make_expert_plan, two_phase_ok
from pi2.runtime import npu
from pi2.runtime.config import DEFAULT_CTX, RunConfig
from pi2.runtime.ffn_rule import FFNRule, choose_rule

C_ARCHS = ("llama", "qwen2", "gemma3", "bamboo")      # what csrc/ runs (model.c's architecture table)
MAX_CTX = 1 << 24           # the largest n_ctx csrc/context.c takes

_NOTED: set = set()     # notes printed once per process: the engine fallback, a file that does not fit


@dataclass
class RunPlan:
    """What a run of `model` with `cfg` does. cache is the neuron cache's split when the FFN streams within
    `budget` (None: everything mapped); cmodel the model as C loaded it (C engine); notes go to stderr once per
    process when the run opens (key, text)."""
    cfg: RunConfig
    engine: str                     # "c" | "reference"
    n_ctx: int
    n_threads: int                  # resolved: > 0
    rule: FFNRule
    npu: npu.NpuUse
    cmodel: CModel | None = None
    budget: int | None = None       # the budget the FFN streams within (given, or the fitted limit)
    io: str = ""                    # the resolved backend of streamed reads
    cache: Plan | ExpertPlan | None = None   # with the NPU's copies when it computes the hot prefix (a MoE file:
                                             # the expert cache's split)
    cache_cpu: Plan | ExpertPlan | None = None   # the same budget without them (the NPU failing to attach falls back)
    stream_gap: str = ""            # why a budget is not enforced for this file ("" when it is or none was given)
    notes: list = field(default_factory=list)


def is_sparse_run(model: Model, cfg: RunConfig) -> bool:
    """Runs that need the sparse FFN: PowerInfer and pi2 files (unless --dense), or --keep below 1."""
    c = model.config
    if cfg.dense:
        return c.pi2 or c.ffn_down_t or c.sparse     # their FFN layout still needs the sparse FFN's reading
    return c.sparse or c.pi2 or c.ffn_down_t or (cfg.keep is not None and cfg.keep < 1.0)


def c_engine_gap(model: Model) -> str:
    """Why the C engine cannot run this model ("" when it can). It runs every architecture ModelConfig accepts,
    PowerInfer `PWRI` files (predictor, ffn_down_t, ReGLU and bamboo's dReLU) and the MoE family included."""
    c = model.config
    if c.moe_family:      # the MoE family (csrc/ffn/moe.c)
        return ""
    if c.arch not in C_ARCHS:
        return f"the C engine does not run {c.arch} models"
    return ""


_WARNED: set = set()


def resolve_ctx(model: Model, n_ctx: int, type_k: int = 1, type_v: int = 1) -> int:
    """-c 0 is the model's training context; the default (4096) is capped at it; other sizes are as given. type_k:
    the K cache's ggml type (-ctk), which check_ctx sizes the cache by."""
    if n_ctx < 0:
        raise UsageError(f"invalid context size {n_ctx}")
    train = model.config.n_ctx_train
    n = train if n_ctx == 0 else min(n_ctx, train) if n_ctx == DEFAULT_CTX else n_ctx
    check_ctx(model, n, "the model's, -c 0" if n_ctx == 0 else "", type_k, type_v)
    if n > train > 0 and ("ctx", n) not in _WARNED:
        _WARNED.add(("ctx", n))     # as llama.cpp: once, and run anyway
        print(f"pi2: warning: -c {n} is larger than the model's training context ({train}): "
              "quality may fall beyond it", file=sys.stderr)
    return n


def check_ctx(model: Model, n_ctx: int, whose: str = "", type_k: int = 1, type_v: int = 1) -> None:
    """Refuse, before anything is allocated, a context larger than the C engine takes (csrc/context.c) or whose KV
    cache (keys of ggml type type_k, -ctk) and buffers exceed the memory this process may use (as the C core counts
    them, for the models it runs)."""
    what = f"a context of {n_ctx} tokens" + (f" ({whose})" if whose else "")
    if n_ctx > MAX_CTX:
        raise UsageError(f"{what} is more than pi2's maximum of {MAX_CTX}", hint="give a smaller -c")
    limit = devices.memory_limit()
    if limit is None or c_engine_gap(model):   # C counts a context's bytes (pi2_ctx_query) of the models it runs
        return
    try:
        need = sum(context_bytes(CModel.from_model(model), n_ctx, 1, type_k=type_k, type_v=type_v))
    except (UnsupportedError, ModelFormatError):
        return
    if need > limit:
        fits = max(1, int(n_ctx * limit / need) // 256 * 256)
        raise UsageError(f"{what} needs {fmt(need)} for its KV cache and buffers, more than the {fmt(limit)} "
                         "this process may use", hint=f"give -c {fits} or less")


def plan_run(model: Model, cfg: RunConfig) -> RunPlan:
    """The run's decisions (UsageError for settings that cannot run). A budget streams a pi2 file's FFN: the C
    model is loaded to size the cache, the device probed for the I/O backend, NNAPI opened to decide the hot
    prefix; `pi2 plan` prints what this returns."""
    n_ctx = resolve_ctx(model, cfg.n_ctx, cfg.type_k, cfg.type_v)
    gap = c_engine_gap(model) if is_sparse_run(model, cfg) or model.config.moe_family else ""
    if model.config.moe_family and cfg.keep is not None:
        raise UsageError(f"--keep does not apply to {model.config.arch} models (experts are computed whole; --dense: "
                         f"ReLU experts compute the up rows of closed gates too)")
    if cfg.engine == "c" and gap:
        raise UsageError(f"{gap}: the C engine cannot run it", hint="use --engine reference (or auto)")
    engine = "reference" if cfg.engine == "reference" or gap else "c"
    threads = cfg.n_threads if cfg.n_threads > 0 else default_threads()
    notes, budget = [], cfg.memory_budget
    if budget is None and engine == "c":
        budget = _fit_memory(model, cfg, n_ctx, notes)
    stream_gap = ""
    moe = _streams_experts(model)
    if budget is not None and moe and engine == "reference":
        raise UsageError("--memory-budget needs the C engine" + (f" ({gap})" if gap else ""))
    if budget is not None and not model.config.pi2 and not moe:
        stream_gap = streamable(model)
        notes.append(("", "a plain GGUF runs from its mapping and --memory-budget is not enforced; `pi2 convert` "
                          "makes a pi2 file whose FFN streams within the budget"))
        budget = None
    elif budget is not None and engine == "reference":
        raise UsageError("--memory-budget needs the C engine" + (f" ({gap})" if gap else ""))
    if cfg.engine == "auto" and gap:
        notes.append(("engine", gap))
    if cfg.no_mmap and engine == "reference":
        notes.append(("no-mmap", "--no-mmap applies to the C engine; the reference engine maps the file"))
    rule = choose_rule(model, cfg.keep, cfg.dense, use_predictor=cfg.predictor)   # checks a predictor's tensors
    p = RunPlan(cfg, engine, n_ctx, threads, rule, npu.for_reference(cfg.npu), budget=budget,
                stream_gap=stream_gap, notes=notes)
    if engine == "c":
        if budget is not None:
            why = (expert_gap(model) if moe else streamable(model)) or split_gap(model)
            if why:
                raise UsageError(why)
            if cfg.no_mmap and cfg.memory_budget is None:     # _fit_memory chose to stream
                raise UsageError(f"--no-mmap reads the whole model into memory, and {os.path.basename(model.path)} "
                                 f"does not fit in the {fmt(budget)} this process may use", hint="drop --no-mmap")
            if cfg.no_mmap:
                raise UsageError("--no-mmap reads the whole model into memory; --memory-budget streams its FFN from "
                                 "the file", hint="give one of them")
            p.io, _ = flash_io.resolve(cfg.io, model.path)
            model.tokenizer      # built now, so that the runtime the plan measures includes it
        p.cmodel = CModel.from_model(model, no_mmap=cfg.no_mmap)
        _plan_cache(model, p)
    return p


def split_gap(model: Model) -> str:
    """Why a split model's FFN cannot stream ("" when it is one file): the streamed reads go to one file."""
    parts = file_parts(model.file)
    if len(parts) == 1:
        return ""
    return (f"the FFN streams from one file, and {os.path.basename(model.path)} is split in {len(parts)} parts: "
            f"merge them first (pi2 convert the first part, or llama-gguf-split --merge)")


def _plan_cache(model: Model, p: RunPlan) -> None:
    """The neuron cache's split of p.budget and NNAPI's part: with the NPU computing a pi2 file's hot prefix, its
    copies are part of the fixed region and the cache keeps no hot prefix of its own."""
    cfg = p.cfg
    if p.budget is not None and _streams_experts(model):   # a MoE file: the expert cache (pi2/plan/experts.py)
        p.cache = p.cache_cpu = make_expert_plan(model, p.cmodel, p.budget, p.n_ctx, p.n_threads, io=p.io,
                                                 n_batch=cfg.n_batch, type_k=cfg.type_k, type_v=cfg.type_v,
                                                 two_phase=p.rule.rule == "relu" and two_phase_ok(model))
        p.cache.learn = cfg.expert_profile        # --no-expert-profile: a plain LRU
        p.npu = npu.plan_batches(model, cfg.npu, cfg.nnapi_lib)
        return
    if p.budget is not None:
        p.cache = p.cache_cpu = make_plan(model, p.cmodel, p.budget, p.n_ctx, p.n_threads, io=p.io, rule=p.rule,
                                          type_k=cfg.type_k, type_v=cfg.type_v)
    if not model.config.pi2:
        p.npu = npu.plan_batches(model, cfg.npu, cfg.nnapi_lib)
        return
    room = p.budget - p.cache.floor if p.cache is not None else None
    p.npu = npu.plan_hot(model, cfg.npu, cfg.nnapi_lib, p.n_threads, room, cfg.npu_gbps)
    if p.npu.hot and p.cache is not None:
        p.cache = make_plan(model, p.cmodel, p.budget, p.n_ctx, p.n_threads, io=p.io, runtime=p.cache_cpu.runtime,
                            npu=p.npu.decision, rule=p.rule, type_k=cfg.type_k, type_v=cfg.type_v)


def _fit_memory(model: Model, cfg: RunConfig, n_ctx: int, notes: list) -> int | None:
    """No --memory-budget: a run uses what the file needs, capped by the memory the process may use
    (devices.memory_limit). A pi2 file that does not fit streams within that limit (its budget, returned); a plain
    GGUF runs from its mapping (the kernel reads weights back in as they are evicted; its read-ahead is kept: the
    dense matmuls scan each matrix in order) and gets a note suggesting `pi2 convert`."""
    limit = devices.memory_limit()
    if limit is None:
        return None
    try:
        kv, scratch = context_bytes(CModel.from_model(model), n_ctx, max(cfg.n_threads, 1), type_k=cfg.type_k,
                                    type_v=cfg.type_v)
    except (UnsupportedError, ModelFormatError):   # not a model the C core runs: its contexts are not counted
        kv = scratch = 0
    need = sum(size for _, _, size in file_parts(model.file)) + kv + scratch + runtime_rss(model) + MARGIN
    if need <= limit:
        return None
    name = os.path.basename(model.path)
    if _streams_experts(model):
        notes.append((f"fit:{name}", f"{name} needs {fmt(need)} but this process may use {fmt(limit)}: its experts "
                                     f"stream from flash within that (as --memory-budget {limit >> 20}M)"))
        return limit
    if model.config.pi2 and not streamable(model):
        notes.append((f"fit:{name}", f"{name} needs {fmt(need)} but this process may use {fmt(limit)}: its FFN "
                                     f"streams from flash within that (as --memory-budget {limit >> 20}M)"))
        return limit
    notes.append((f"fit:{name}", f"{name} needs {fmt(need)} but this process may use {fmt(limit)}: it runs from its "
                                 "mapping, re-reading weights from flash as they are evicted (slow); `pi2 convert` "
                                 "makes a pi2 file whose FFN streams only the neurons each token needs"))
    return None


def _streams_experts(model) -> bool:
    """A plain MoE GGUF whose experts can stream (csrc/cache/experts.h)."""
    c = model.config
    return bool(c.moe_family and c.n_expert and not c.pi2 and not expert_gap(model))


def take_notes(p: RunPlan) -> list:
    """The plan's notes not printed yet in this process (a keyed note once per process, an unkeyed one always)."""
    out = []
    for key, text in p.notes:
        if key and key in _NOTED:
            continue
        if key:
            _NOTED.add(key)
        out.append(text)
    return out
