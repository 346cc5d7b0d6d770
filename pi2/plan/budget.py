"""budget.py — the first planner: how a pi2 file runs inside `--memory-budget SIZE`.

Owns: the measured floor (the process's RSS with the runtime loaded + the
fixed region the forward pass maps, with the NPU's copies when it computes the hot prefix + KV cache +
scratch + a margin + the fewest cold slots the neuron cache needs), and the split of the rest: the hot
prefix of each layer (clusters taken in descending activation frequency, `blk.L.ffn_freq`, so hot is
always a prefix) and the cold cluster slots; the cluster size, queue depth and I/O backend.
With the file's predictor (the `predicted` rule) the gate rows stream too (two-phase loading): they leave the
fixed region (the low-bit predictor stays), one layer's gate clusters of slots join the floor, and gate clusters
compete with bundle clusters for the hot prefixes. Rule: every cluster, gate or bundle, is worth its chance of
being read per token per byte it holds, i.e. the mean frequency of its neurons: ffn_freq for bundles, the
predicted frequency for gate rows (ffn_freq scaled, capped at 1, to the layer's predicted share: the keep at which
the calibrated threshold curve `blk.L.ffn_thresh` reaches the layer's cut t_L − m_L); clusters are taken in
descending worth while they fit, each kind's choice staying a prefix per layer.
Does not: read weights or time anything (csrc/cache/cache.c streams; pi2/plan/profile.py measures the device and
reads its throughput back).
The minimum (min_budget) and the split are built from the same Plan fields and stream sizes, in this one file, so
`pi2 plan` and `pi2 run` can only ever name one minimum. The Plan record and its printing are in
pi2/plan/budget_plan.py (Plan, fmt and QUEUE_DEPTH are importable from here too).
"""
from __future__ import annotations

import os
import resource
import sys

import numpy as np

from pi2.engine import ROLES, ctx_sizes, stream_sizes, tensor_descs
from pi2.errors import UsageError
from pi2.plan.budget_plan import EARLY_P, MiB, QUEUE_DEPTH, Plan, fmt  # noqa: F401 — QUEUE_DEPTH: experts.py's
from pi2.plan.profile import cached_throughput

# what the process allocates or reads after planning (Python objects while generating, modules imported later,
# page cache around the fixed region): SmolLM2 under a cgroup peaked 5-8 MiB above a 16 MiB margin
MARGIN = 32 * MiB


def runtime_rss(model=None) -> int:
    """What this process holds now as a memory cgroup counts it, estimated: resident bytes (VmRSS: the
    interpreter, numpy, the C core) + the page cache its imports filled (the size of every loaded module's
    source and bytecode, read but not mapped) + the model file's metadata (everything before its first tensor)."""
    rss = 0
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) * 1024
    except OSError:
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    seen = set()
    for mod in list(sys.modules.values()):
        for attr in ("__file__", "__cached__"):
            f = getattr(mod, attr, None)
            if isinstance(f, str) and not f.endswith((".so", ".pyd")) and f not in seen:
                seen.add(f)
                try:
                    rss += os.path.getsize(f)
                except OSError:
                    pass
    if model is not None and model.file.tensors:
        rss += min(t.offset for t in model.file.tensors.values())
    return rss


def fixed_bytes(model, n_ctx: int, gate: bool = False, pred: bool | None = None) -> int:
    """Bytes of the tensors the forward pass reads through the mapping in a streamed run: all but the up and down
    rows of the bundles (and the gate rows when they stream too: `gate`, the run uses the file's pi2-made predictor;
    without it the predictor's tensors are never read and do not count) (a tied output counted once); token
    embeddings that are not also the output are read a row per token (with no read-ahead, csrc/cache/cache.c), so they
    count n_ctx rows of whole pages at most. pred: the run uses the predictor (default: gate)."""
    descs = tensor_descs(model)
    out_offset = next(t.offset for role, _l, t in descs if role == ROLES["output"])
    streamed = (ROLES["ffn_up"], ROLES["ffn_down_rows"]) + ((ROLES["ffn_gate"],) if gate else ())
    if "pi2.predictor.kind" in model.file.kv and not (gate if pred is None else pred):   # the predictor's tensors
        streamed += (ROLES["ffn_gate_pred"], ROLES["ffn_pred_fc1"], ROLES["ffn_pred_fc2"])
    seen = {}
    for role, _layer, t in descs:
        if role in streamed:
            continue
        n = t.nbytes
        if role == ROLES["token_embd"] and t.offset != out_offset:
            n = min(n, n_ctx * (-(-(n // t.ne[1]) // 4096) + 1) * 4096)
        seen[t.offset] = max(seen.get(t.offset, 0), n)
    return sum(seen.values())


def context_bytes(cmodel, n_ctx: int, n_threads: int, n_batch: int = 512, type_k: int = 1, type_v: int = 1) -> tuple:
    """(KV cache bytes, scratch bytes) of a C context on `cmodel` (an engine.CModel): what pi2_ctx_init allocates,
    as the C core counts it (pi2_ctx_query); type_k: the K cache's ggml type (-ctk)."""
    return ctx_sizes(cmodel, n_ctx, n_threads, n_batch, type_k, type_v)


CLUSTERS = (8, 16, 32, 64)   # neurons per cluster the C cache takes (divisors of its 64-neuron groups)


def cluster_for(bundle_bytes: int) -> int:
    """Neurons per cluster: the smallest of 8, 16, 32, 64 whose reads are at least 32 KiB."""
    for c in (8, 16, 32, 64):
        if c * bundle_bytes >= 32 * 1024:
            return c
    return 64


def bundle_ud_gap(model, what: str) -> str:
    """Why `what` cannot use `model`'s FFN bundles ("" when the model is a pi2 file in the bundle-ud layout)."""
    cfg = model.config
    if not cfg.pi2:
        return f"{what} needs a pi2 file (made by pi2 convert)"
    if cfg.ffn_layout != "bundle-ud":
        return f"{what} needs the bundle-ud layout; this file is {cfg.ffn_layout}"
    return ""


def streamable(model) -> str:
    """Why `model` cannot run under a budget ("" when it can)."""
    return bundle_ud_gap(model, "--memory-budget")


def predicted_share(model, rule) -> np.ndarray:
    """Per layer, the expected share of neurons the `predicted` rule's P holds: the keep at which the file's
    calibrated threshold curve (`blk.L.ffn_thresh` over pi2.ffn.keep_grid) crosses the layer's cut t_L − m_L."""
    grid = np.asarray(model.file.kv["pi2.ffn.keep_grid"], np.float64)
    out = []
    for il, cut in enumerate(np.asarray(rule.cuts, np.float64)):
        thr = np.asarray(model.raw(f"blk.{il}.ffn_thresh.weight")).view(np.float32).reshape(-1).astype(np.float64)
        out.append(1.0 if cut <= thr[-1] else float(np.interp(-cut, -thr, grid)))   # thresholds fall as keep grows
    return np.asarray(out)


def _take_hot(items: list, left: int, n_layer: int) -> tuple:
    """Greedy hot prefixes: items (key, kind, layer, cluster, cost) in ascending key (descending worth); each
    kind's clusters of a layer taken in order while they fit. ({kind: hot clusters per layer}, bytes left)."""
    hot = {kind: [0] * n_layer for kind in {it[1] for it in items}}
    for _key, kind, il, c, cost in sorted(items):
        if c != hot[kind][il] or cost > left:      # keep prefixes; stop a layer at its first cluster not taken
            continue
        hot[kind][il] += 1
        left -= cost
    return hot, left


def _predicted_rule(rule) -> bool:
    """Whether the run's rule is the file's predictor (`predicted`): its gate rows stream too (two-phase loading)."""
    return rule is not None and rule.rule == "predicted"


def make_plan(model, cmodel, budget: int, n_ctx: int, n_threads: int, io: str = "auto", n_batch: int = 512,
              cluster: int | None = None, runtime: int | None = None, npu=None, rule=None, type_k: int = 1,
              type_v: int = 1) -> Plan:
    """The split of `budget` for `model` (a loader.Model) loaded as `cmodel`; UsageError below the floor.
    runtime: the process's own bytes (default: measured now, runtime_rss). npu: the NPU's decision
    (npu_plan.NpuDecision) when it computes the hot prefix: its copies join the fixed region, the cache keeps
    no hot prefix (the CPU reads those neurons only after an NPU failure) and they are not expected reads.
    rule: the run's runtime.ffn_rule.FFNRule; under `predicted` the gate rows stream too (the module's rule).
    cluster: neurons per cluster; by default the one of CLUSTERS whose plan reads its expected flash bytes per
    token fastest on the device profile (bigger reads run faster, but read more inactive neurons), or, with no
    profile, cluster_for's rule."""
    why = streamable(model)
    if why:
        raise UsageError(why)
    runtime, up = runtime_bounds(model) if runtime is None else (runtime, runtime)
    args = (model, cmodel, budget, n_ctx, n_threads, io, n_batch, runtime, npu, rule)
    need = min_budget(model, cmodel, n_ctx, n_threads, io, n_batch, cluster, runtime, npu, rule, type_k=type_k,
                      type_v=type_v)
    shown = need + up - runtime     # the minimum as printed: with the RSS rounded up
    if budget < need:
        kv = context_bytes(cmodel, n_ctx, n_threads, n_batch, type_k, type_v)[0]
        gate = _predicted_rule(rule)
        raise UsageError(f"--memory-budget {fmt(budget)} is below the minimum of {fmt(shown)} for this model at a "
                         f"context of {n_ctx}" + (" with the predictor's gate streaming" if gate else ""),
                         hint=f"give at least {(shown + MiB - 1) // MiB}M" + (" or a smaller -c" if kv > need // 4 else ""))
    c0 = cluster or cluster_for(stream_sizes(cmodel, 64, 0, 0)["bundle_bytes"])

    def fit(c):
        try:
            return _plan(*args, c, type_k=type_k, type_v=type_v)
        except UsageError as e:   # below the floor with the gate rows mapped: stream them too, whole, if they can
            if _predicted_rule(rule) or not stream_sizes(cmodel, c, 0, 0)["gate_slot_bytes"]:
                return None
            try:
                return _plan(*args, c, gate_whole=True, floor_mapped=getattr(e, "floor", 0), type_k=type_k,
                             type_v=type_v)
            except UsageError:
                return None
    # the budget is at least the minimum: some cluster size fits (the preferred one, else the first that does)
    first = fit(c0) or next(p for p in (fit(c) for c in CLUSTERS if c != c0) if p is not None)
    whole = first.gate_whole
    first.minimum = shown
    if cluster or first.read_mbps is None:
        return first
    best = first
    for c in CLUSTERS:
        if c == first.cluster:
            continue
        try:
            p = _plan(*args, c, gate_whole=whole, floor_mapped=first.floor_mapped_gate, type_k=type_k, type_v=type_v)
        except UsageError:          # a floor above the budget (bigger slots)
            continue
        if p.read_mbps and p.read_seconds < best.read_seconds:
            best = p
    best.minimum = shown
    return best


def min_budget(model, cmodel, n_ctx: int, n_threads: int, io: str = "auto", n_batch: int = 512,
               cluster: int | None = None, runtime: int | None = None, npu=None, rule=None, type_k: int = 1,
               type_v: int = 1) -> int:
    """The smallest budget make_plan accepts with these settings: the lowest floor over the cluster sizes it may
    choose, with the gate rows mapped or (when they can) streamed whole. `pi2 plan` prints it and a refused
    `--memory-budget` names it: one figure, whatever budget was asked for."""
    runtime = measured_runtime(model) if runtime is None else runtime
    args = (model, cmodel, 1 << 62, n_ctx, n_threads, io, n_batch, runtime, npu, rule)
    gate_whole = (False,) if _predicted_rule(rule) or \
        not stream_sizes(cmodel, 64, 0, 0)["gate_slot_bytes"] else (False, True)
    clusters = (cluster,) if cluster else \
        tuple(dict.fromkeys([cluster_for(stream_sizes(cmodel, 64, 0, 0)["bundle_bytes"]), *CLUSTERS]))
    return min(_base(*args, c, gate_whole=g, type_k=type_k, type_v=type_v)[0].floor
               for c in clusters for g in gate_whole)


def measured_runtime(model) -> int:
    """runtime_rss rounded up to 4 MiB: what every minimum printed (the plan's, a refused budget's hint) counts."""
    return runtime_bounds(model)[1]


def runtime_bounds(model) -> tuple:
    """runtime_rss on a 4 MiB grid, rounded (down, up). The interpreter's RSS varies by a MiB or two between
    processes (`pi2 plan` and `pi2 run` with the same flags): a budget is checked (and split) with the RSS rounded
    down and every minimum is printed with it rounded up, so the minimum one process prints is one another, whose
    RSS differs by less than a step, accepts (one grid rounded one way both times fails when the RSS sits on a
    step; the 32 MiB margin covers the step)."""
    step = 4 * MiB
    rss = runtime_rss(model)
    return rss // step * step, (rss + step - 1) // step * step


def _base(model, cmodel, budget, n_ctx, n_threads, io, n_batch, runtime, npu, rule, cluster, gate_whole=False,
          floor_mapped=0, type_k=1, type_v=1) -> tuple:
    """The plan's fixed parts at one cluster size (its floor), before any hot prefix: (Plan, sizes, kv)."""
    npu = npu if npu is not None and npu.use else None
    cfg = model.config
    L, F = cfg.n_layer, cfg.n_ff
    gate = _predicted_rule(rule)
    streams_gate = gate or gate_whole
    sizes = [stream_sizes(cmodel, cluster, il, 0) for il in range(L)]
    kv, scratch = context_bytes(cmodel, n_ctx, n_threads, n_batch, type_k, type_v)
    p = Plan(budget=budget, runtime=runtime,
             fixed=fixed_bytes(model, n_ctx, streams_gate, pred=gate) + (npu.bytes if npu else 0), kv=kv,
             scratch=scratch, margin=MARGIN,
             cluster=cluster, slot_bytes=sizes[0]["slot_bytes"], min_slots=sizes[0]["min_slots"],
             n_slots=sizes[0]["min_slots"], n_hot=[0] * L, io=io, n_ff=F,
             ffn_bytes=sum(s["layer_bytes"] for s in sizes), npu_bytes=npu.bytes if npu else 0, gate=gate,
             gate_whole=gate_whole, floor_mapped_gate=floor_mapped)
    if rule is not None and not gate:   # a rule without the file's predictor: why the gate rows stay mapped
        p.gate_note = ("the file has no pi2 predictor" if "pi2.predictor.kind" not in model.file.kv
                       else f"the run's rule is {rule.rule}, not the file's predictor")
    if streams_gate:
        p.gate_bytes = sum(s["gate_layer_bytes"] for s in sizes)
        p.gate_slot_bytes = sizes[0]["gate_slot_bytes"]
        p.n_gate_slots, p.n_gate_hot = p.min_slots, [0] * L
    return p, sizes, kv


def _plan(model, cmodel, budget, n_ctx, n_threads, io, n_batch, runtime, npu, rule, cluster, gate_whole=False,
          floor_mapped=0, type_k=1, type_v=1) -> Plan:
    """make_plan at one cluster size; gate_whole: the gate rows stream, read whole each token."""
    p, sizes, kv = _base(model, cmodel, budget, n_ctx, n_threads, io, n_batch, runtime, npu, rule, cluster,
                         gate_whole, floor_mapped, type_k, type_v)
    npu = npu if npu is not None and npu.use else None
    L, F, gate = len(p.n_hot), p.n_ff, p.gate      # as _base set them
    streams_gate = gate or gate_whole
    if budget < p.floor:
        e = UsageError(f"--memory-budget {fmt(budget)} is below the minimum for this model at a context of {n_ctx}"
                       + (" with the predictor's gate streaming" if gate else ""))
        e.floor = p.floor
        raise e
    left = budget - p.floor - 8192 * L * (2 if gate else 1)   # room for the hot prefixes (+ their 4 KiB alignment)
    share = predicted_share(model, rule) if gate else None
    # hot clusters in descending mean activation frequency: within a layer frequencies descend, so each
    # layer's choice is a prefix; gate clusters (kind 0) by their predicted frequency, before bundles on a tie
    items, need, gneed = [], [], []
    n_cl = (F + cluster - 1) // cluster
    for il in range(L):
        freq = np.asarray(model.raw(f"blk.{il}.ffn_freq.weight")).view(np.float32).reshape(-1)[:F]
        pad = np.zeros(n_cl * cluster, np.float32)
        pad[:F] = np.clip(freq, 0.0, 1.0)
        if gate:
            gpad = np.minimum(pad * (share[il] / max(float(pad[:F].mean()), 1e-9)), 1.0).reshape(n_cl, cluster)
            gneed.append(1.0 - np.prod(1.0 - gpad.astype(np.float64), axis=1))   # P(a cluster has a predicted one)
            items += [(-float(s), 0, il, c, min(cluster, F - c * cluster) * sizes[il]["gate_row_bytes"])
                      for c, s in enumerate(gpad.mean(axis=1))]
        if npu:
            pad[:npu.n_hot[il]] = 0.0              # the NPU's neurons: never read by the CPU
        per = pad.reshape(n_cl, cluster)
        need.append(1.0 - np.prod(1.0 - per.astype(np.float64), axis=1))   # P(a cluster has an active neuron)
        if not npu:
            items += [(-float(s), 1, il, c, min(cluster, F - c * cluster) * sizes[il]["bundle_bytes"])
                      for c, s in enumerate(per.mean(axis=1))]
    hot, left = _take_hot(items, left, L)
    hot_cl = hot.get(1, [0] * L)
    p.n_hot = [min(h * cluster, F) for h in hot_cl]
    if not streams_gate:   # the leading cold clusters nearly every token needs: read while attention computes
        likely = [need[il][hot_cl[il]:] >= EARLY_P for il in range(L)]
        p.n_early = [min(p.queue_depth, len(t) if t.all() else int(np.argmin(t))) for t in likely]
    p.hot_bytes = sum(stream_sizes(cmodel, cluster, il, p.n_hot[il])["hot_bytes"] for il in range(L))
    read = min(p.slot_bytes, cluster * sizes[0]["bundle_bytes"] + 4096)
    p.flash_bytes = int(sum(need[il][hot_cl[il]:].sum() for il in range(L)) * read)
    if gate:
        p.n_gate_hot = [min(h * cluster, F) for h in hot[0]]
        p.gate_hot_bytes = sum(stream_sizes(cmodel, cluster, il, p.n_gate_hot[il])["gate_hot_bytes"] for il in range(L))
        gread = min(p.gate_slot_bytes, cluster * sizes[0]["gate_row_bytes"] + 4096)
        p.gate_flash_bytes = int(sum(gneed[il][hot[0][il]:].sum() for il in range(L)) * gread)
        p.flash_bytes += p.gate_flash_bytes
        p.pred_share = float(np.mean(share))
    elif gate_whole:   # every token reads every layer's gate region
        p.gate_flash_bytes = p.gate_bytes
        p.flash_bytes += p.gate_flash_bytes
    p.read_mbps, p.profile_note = cached_throughput(model.path, p.slot_bytes, p.queue_depth)
    n_cold = sum(n_cl - h - (npu.n_hot[il] // cluster if npu else 0) for il, h in enumerate(hot_cl))
    if left > p.slot_bytes:                        # what the hot prefixes left over: more cold slots, as many as
        p.n_slots = max(p.min_slots, min(p.n_slots + int(left // p.slot_bytes), n_cold))   # there are cold clusters
    return p
