"""session.py — a model opened for a run: the context (C or reference) made as plan_run decided, NNAPI attached and
the neuron cache set up, and what the runtime keeps about it (Session: the plan, the NPU's state and notes).

Owns: opening a model (open_model) and a session on it (open_session), the order in which a C context is set up
(FFN rule, NNAPI, then the cache: the hot prefix the NPU computes is not cached), the session's notes on stderr,
its figures for bench and --verbose (stats), and what a run that streamed experts leaves for the next one
(keep_routing: its routing added to the file's profile).
Does not: decide anything (pi2/runtime/plan.py) or generate (pi2/runtime/generate.py).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pi2.errors import UsageError
from pi2.engine import CContext, kernel_info
from pi2.model.loader import Model, load_model
from pi2.plan.budget import Plan
from pi2.plan.expert_profile import add_to_profile
from pi2.reference.forward import ReferenceContext
from pi2.reference.moe import MoEContext
from pi2.runtime import npu
from pi2.runtime.config import RunConfig
from pi2.runtime.ffn_rule import dense_prefix
from pi2.runtime.plan import RunPlan, plan_run, take_notes


def open_model(path) -> Model:
    return load_model(path)


@dataclass
class Session:
    """A model and its evaluation context for one sequence. decode / reset / n_past / n_ctx are the context's
    (generate and perplexity take a session or a bare context alike)."""
    model: Model
    plan: RunPlan
    ctx: CContext | ReferenceContext | MoEContext
    npu: npu.NpuUse
    cache: Plan | None = None      # the neuron cache's split in force (None: everything mapped)

    @property
    def engine(self) -> str:
        return self.plan.engine

    @property
    def n_ctx(self) -> int:
        return self.ctx.n_ctx

    @property
    def n_past(self) -> int:
        return self.ctx.n_past

    def decode(self, tokens, all_logits: bool = False) -> np.ndarray:
        return self.ctx.decode(tokens, all_logits)

    def reset(self) -> None:
        self.ctx.reset()

    def stats(self) -> dict:
        """Bench figures since the previous call: ffn_keep and ffn_bytes_per_token (every neuron for engines
        without a sparse FFN), the neuron cache's (streamed runs) and the NPU's."""
        st = dict(self.ctx.bench_stats())
        if self.cache is not None:
            st["memory_budget"] = self.cache.budget
        st.setdefault("ffn_keep", 1.0)
        st.setdefault("ffn_bytes_per_token", dense_ffn_bytes(self.model))
        st.update(npu.bench_fields(self.ctx, self.npu))
        if isinstance(self.ctx, CContext):   # the kernels' CPU variant and the bytes of repacked weights
            st.update(kernel_variant=kernel_info()["variant"], repacked_bytes=getattr(self.ctx.cmodel, "repacked", 0))
        return st

    def notes(self) -> list:
        """Why NNAPI was not used or fell back to the CPU (--verbose)."""
        return npu.notes(self.npu)


def dense_ffn_bytes(model) -> int:
    """FFN weight bytes a dense token reads: every gate, up and down matrix."""
    return sum(t.nbytes for n, t in model.file.tensors.items()
               if n.endswith((".ffn_gate.weight", ".ffn_up.weight", ".ffn_down.weight", ".ffn_down_t.weight")))


def open_session(model: Model, cfg: RunConfig | RunPlan) -> Session:
    """A fresh context on `model` as plan_run(model, cfg) decides (or as the given plan says); the plan's notes go
    to stderr (each once per process)."""
    p = cfg if isinstance(cfg, RunPlan) else plan_run(model, cfg)
    for text in take_notes(p):
        print(f"pi2: note: {text}", file=sys.stderr)
    n_keep = p.cfg.n_keep + int(bool(model.tokenizer.add_bos))    # llama-completion keeps the BOS too
    if p.engine == "reference":
        npu.attach(None, p.npu)
        if model.config.moe_family and (p.cfg.type_k != 1 or p.cfg.flash):
            raise UsageError(f"-ctk {p.cfg.cache_type_k} -fa {p.cfg.flash_attn}: the reference engine keeps an F16 K "
                             f"cache without flash attention for {model.config.arch} models",
                             hint="use the C engine (--engine c or auto)")
        ref = MoEContext(model, p.n_ctx) if model.config.moe_family else \
            ReferenceContext(model, p.n_ctx, p.rule, ctx_shift=p.cfg.ctx_shift, n_keep=n_keep, type_k=p.cfg.type_k,
                             flash_attn=p.cfg.flash, type_v=p.cfg.type_v)
        return Session(model, p, ref, p.npu)
    ctx = CContext(p.cmodel, p.n_ctx, p.n_threads, n_batch=p.cfg.n_batch, ctx_shift=p.cfg.ctx_shift, n_keep=n_keep,
                   type_k=p.cfg.type_k, flash_attn=p.cfg.flash, type_v=p.cfg.type_v)
    ctx.set_ffn(p.rule)
    npu.attach(ctx, p.npu)      # first: whether the NPU took the hot prefix decides the cache split in force
    cache = p.cache if p.npu.state == "nnapi" else p.cache_cpu
    if p.cfg.repack:    # attention and output (the FFN too when every neuron is computed in memory) in the packed
        # MoE: experts whole or by neuron; a pi2 file's sparse FFN: its gate rows and down rows (whose kernels read
        # every gate row, and a group's rows from its packed copy), unless a predictor picks the gate rows to read
        sparse_pi2 = model.config.pi2 and p.rule.rule in ("threshold", "topk")
        ffn = (p.rule.rule == "dense" or model.config.moe_family or sparse_pi2) and cache is None
        if ffn and sparse_pi2:   # the hottest neurons' up rows computed whole, with the gate rows
            p.cmodel.ffn_prefix(dense_prefix(model, p.rule) or [0] * model.config.n_layer)
        repacked = p.cmodel.repack(ffn=ffn)   # the packed kernels' layout; same bits
        if cache is not None:
            cache.repacked = repacked      # the copies replace their mapped pages: the fixed region is unchanged
    if cache is not None:
        ctx.set_stream(**cache.stream_args())
    return Session(model, p, ctx, p.npu, cache)


def keep_routing(*sessions: Session) -> Path | None:
    """At the end of a run whose MoE experts streamed (unless --no-expert-profile): add its routing to the file's
    routing profile, so the next run's plan starts with the hot experts this one learned; the profile's path, or None
    (not such a run, or too short to say much: pi2/plan/expert_profile.add_to_profile). Several sessions of one model (pi2
    serve's slots) add their routing together, once. A profile that cannot be written is a note on stderr and the
    old one stays whole."""
    kept = [s for s in sessions if getattr(s.cache, "kind", "") == "experts" and s.plan.cfg.expert_profile
            and isinstance(s.ctx, CContext)]
    if not kept:
        return None
    try:
        path, _tokens = add_to_profile(kept[0].model, sum(s.ctx.expert_counts for s in kept))
    except OSError as e:
        print(f"pi2: note: the routing profile was not saved: {e}", file=sys.stderr)
        return None
    return path
