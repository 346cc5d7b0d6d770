"""experts.py — the expert cache's split of a memory budget for a MoE GGUF (csrc/cache/experts.h): what stays
mapped (the fixed region: attention, norms, routers, shared experts, embeddings rows, output, a converted file's I8
scales), the KV cache and buffers, and the rest as expert slots (each one expert's gate, up and down slices, or a
converted file's gate rows and up/down bundles, 4 KiB-aligned), of which the experts a routing profile names most
often are resident (hot) and the others an LRU shared by all layers. A converted file under the relu rule reads a
decoded token's misses in two phases (gate rows, then the bundle clusters with an open neuron): `open_read_bytes`.

Owns: `expert_gap` (why a file cannot stream its experts), `make_expert_plan`, ExpertPlan (its lines for `pi2 plan`,
its stream_args for CContext.set_stream), the expected hit rate and flash bytes per token, and the routing profile
(`pi2 profile-experts` runs it; kept in ~/.cache/pi2/experts/ by expert_profile.py, which a streamed run's
routing is added to).
Does not: read weights or time anything; the neuron cache of pi2 files (budget.py).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

import numpy as np

from pi2.model.calib import calib_tokens
from pi2.engine import CContext, CModel, default_threads
from pi2.errors import UsageError
from pi2.engine.expert_clusters import CLUSTER
from pi2.model import expert_bundles
from pi2.model.gguf_file import GGML_TYPES
from pi2.plan.budget import MARGIN, QUEUE_DEPTH, context_bytes, fmt, runtime_bounds
from pi2.plan.expert_profile import load_profile, save_profile
from pi2.plan.profile import cached_throughput

ALIGN = 4096
SLICES = ("gate", "up", "down")
STREAMED = re.compile(r"\.ffn_(gate|up|down|bundle)_exps\.")   # read into slots; a converted file's scales stay mapped
MIN_COLD_PER_K = 2      # cold slots kept at least 2·k when hot experts are chosen: a token's misses and the next's
PRE_OPEN = 0.5          # two phases: leading clusters a token opens at least this often are read with the gate rows


def _align_up(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def expert_gap(model) -> str:
    """Why `model` cannot stream its experts under a budget ("" when it can)."""
    c = model.config
    if not c.moe_family or not c.n_expert:
        return f"{os.path.basename(model.path)} has no experts to stream"
    names = model.file.tensors
    for il in range(c.n_layer):
        if c.expert_bundles and expert_bundles.has_bundles(model, il):
            continue
        have = [f"blk.{il}.ffn_{s}_exps.weight" in names for s in SLICES]
        if any(have) and not all(have):
            return f"layer {il} has only some of ffn_{{gate,up,down}}_exps"
    return ""


def expert_layers(model) -> list:
    """Per layer: (bytes of one expert's gate, up, down slice) or None when the layer has no experts; a converted
    file's layer (up/down bundles): (gate, bundle records, 0), its down rows being inside the records."""
    c, names = model.config, model.file.tensors
    out = []
    for il in range(c.n_layer):
        if c.expert_bundles and expert_bundles.has_bundles(model, il):
            ts = [names[f"blk.{il}.ffn_{s}_exps.weight"] for s in ("gate", "bundle")]
            out.append(tuple(t.nbytes // c.n_expert for t in ts) + (0,))
            continue
        ts = [names.get(f"blk.{il}.ffn_{s}_exps.weight") for s in SLICES]
        out.append(None if ts[0] is None else tuple(t.nbytes // c.n_expert for t in ts))
    return out


def _span(n: int) -> int:
    """Room of a slice of n bytes in a slot (its enclosing 4 KiB span at most), 0 for no slice."""
    return _align_up(n) + ALIGN if n else 0


def slot_bytes(model) -> int:
    """One expert slot as csrc/cache/experts.c lays it out: per slice, the largest slice rounded up + 4 KiB."""
    layers = [b for b in expert_layers(model) if b]
    return sum(max(_span(b[w]) for b in layers) for w in range(3))


def read_bytes(model) -> list:
    """Per expert layer: bytes one miss reads (the enclosing 4 KiB spans of its slices, at most)."""
    return [sum(_span(b[w]) for w in range(3)) for b in expert_layers(model) if b]


def two_phase_ok(model) -> bool:
    """A converted file whose single tokens read their experts in two phases under the relu rule: up rows that
    csrc/ffn/moe_relu.c computes one neuron at a time (Q4_0, F32, F16)."""
    c = model.config
    return bool(c.expert_bundles and c.expert_act == "relu" and all(
        GGML_TYPES[expert_bundles.layout(model, il)["up_type"]][0] in ("Q4_0", "F32", "F16")
        for il in range(c.n_layer) if expert_bundles.has_bundles(model, il)))


def open_read_bytes(model, uses: int = 1) -> list | None:
    """A converted file, per expert layer: the expected bytes of a miss that reads the gate rows and then only the
    clusters of CLUSTER neurons with an open one (neurons independent, each open with its ffn_freq_exps frequency,
    experts weighted by their routed calibration rows); with uses > 1 the clusters any of that many tokens opened
    (what a cached expert's slot holds after them); None for a plain MoE file."""
    c = model.config
    if not c.expert_bundles:
        return None
    out = []
    for il, b in enumerate(expert_layers(model)):
        if not b:
            continue
        freq = model.raw(f"blk.{il}.ffn_freq_exps.weight").view(np.float32).reshape(c.n_expert, c.n_ff_exp)
        routed = model.raw(f"blk.{il}.ffn_routed_exps.weight").view(np.float32).astype(np.float64)
        n_cl = -(-c.n_ff_exp // CLUSTER)
        pad = np.zeros((c.n_expert, n_cl * CLUSTER), np.float64)
        pad[:, :c.n_ff_exp] = freq
        p_open = 1.0 - np.prod(1.0 - pad.reshape(c.n_expert, n_cl, CLUSTER), axis=2)    # [X][clusters]
        p_open = 1.0 - (1.0 - p_open) ** uses
        w = routed / routed.sum() if routed.sum() > 0 else np.full(c.n_expert, 1.0 / c.n_expert)
        width = b[1] // c.n_ff_exp
        out.append(_span(b[0]) + float((w * p_open.sum(axis=1)).sum()) * CLUSTER * width)
    return out


def pre_clusters(model, p_min: float = PRE_OPEN) -> np.ndarray | None:
    """A converted file: per layer and expert, how many of its leading bundle clusters (hot-first neurons) a token
    opens with probability p_min or more each (from ffn_freq_exps, neurons independent): read with the expert's gate
    rows, so the second phase finds them; [n_layer][n_expert] int32, None for a plain MoE file."""
    c = model.config
    if not c.expert_bundles:
        return None
    n_cl = -(-c.n_ff_exp // CLUSTER)
    out = np.zeros((c.n_layer, c.n_expert), np.int32)
    for il, b in enumerate(expert_layers(model)):
        if not b:
            continue
        freq = model.raw(f"blk.{il}.ffn_freq_exps.weight").view(np.float32).reshape(c.n_expert, c.n_ff_exp)
        pad = np.zeros((c.n_expert, n_cl * CLUSTER), np.float64)
        pad[:, :c.n_ff_exp] = freq
        p_open = 1.0 - np.prod(1.0 - pad.reshape(c.n_expert, n_cl, CLUSTER), axis=2)
        low = p_open < p_min
        out[il] = np.where(low.any(axis=1), low.argmax(axis=1), n_cl)   # the run before the first unlikely one
    return out


def fixed_region(model, n_ctx: int) -> int:
    """Mapped bytes the forward pass reads: every tensor but the experts; token embeddings not tied to the output
    count n_ctx rows of whole pages at most (as budget.fixed_bytes)."""
    out = model.file.tensors.get("output.weight")
    total = 0
    for name, t in model.file.tensors.items():
        if STREAMED.search(name):
            continue
        n = t.nbytes
        if name == "token_embd.weight" and out is not None:
            n = min(n, n_ctx * (-(-(n // t.ne[1]) // ALIGN) + 1) * ALIGN)
        total += n
    return total


def profile_experts(model, calib=None, n_tokens: int = 2048, n_threads: int = 0) -> tuple:
    """Route the calibration text (chunks as `pi2 convert` takes them) through the C engine and save the rows each
    expert received (the profile the planner picks hot experts from); (path, tokens, counts)."""
    if expert_gap(model):
        raise UsageError(expert_gap(model))
    chunks, _sha, n_tok = calib_tokens(model.tokenizer, calib, n_tokens)
    ctx = CContext(CModel.from_model(model), max(len(ch) for ch in chunks) + 1, n_threads or default_threads())
    for ch in chunks:
        ctx.reset()
        ctx.decode(ch)
    counts = ctx.expert_counts
    return save_profile(model, counts, n_tok), n_tok, counts


@dataclass
class ExpertPlan:
    budget: int
    runtime: int
    fixed: int
    kv: int
    scratch: int
    margin: int
    slot_bytes: int
    n_expert: int
    k: int
    n_layers: int               # layers with experts
    n_slots: int                # cold slots
    hot: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), bool))   # [n_layer][n_expert] resident
    expert_bytes: int = 0       # every expert's slices in the file
    miss_bytes: float = 0.0     # mean bytes one miss reads (expected, in two phases)
    whole_bytes: float = 0.0    # mean bytes of one miss's whole slices
    two_phase: bool = False     # a converted file under the relu rule: gate rows, then open clusters (decode)
    hit_rate: float = 0.0       # expected share of needed experts found hot or cached (decode)
    flash_bytes: int = 0        # expected bytes read per decoded token
    profiled: bool = False      # hot experts and the hit rate from a routing profile (else uniform routing)
    io: str = "auto"
    queue_depth: int = QUEUE_DEPTH
    read_mbps: float | None = None
    profile_note: str = ""
    ahead: bool = True
    learn: bool = True          # hot experts learned while running (cache/experts_learn.c) in the cold slots
    repacked: int = 0
    kind: str = "experts"
    read_bytes_each: float = 0.0   # the read size the device profile's throughput is looked up at
    n_slices: int = 3              # spans of a slot (a converted file: gate rows and bundles)
    up: int = 0                 # the runtime's RSS rounded up less rounded down (runtime_bounds): printed, not checked
    cap: int = 0                # two phases: bytes the cold slots may hold (slots sized to what is read), else 0
    held_each: float = 0.0      # ... expected bytes a cached expert's slot holds (gate rows + clusters of 2 tokens)
    n_effective: int = 0        # ... experts the cap is expected to hold (the hit rate's LRU size)
    pre: np.ndarray | None = None   # ... [n_layer][n_expert] leading clusters read with the gate rows (pre_clusters)

    @property
    def min_slots(self) -> int:
        return self.k

    @property
    def floor(self) -> int:
        return self.runtime + self.fixed + self.kv + self.scratch + self.margin + self.min_slots * self.slot_bytes

    @property
    def minimum(self) -> int:
        """The floor as printed (pi2 plan, a refused budget's hint): one another process accepts."""
        return self.floor + self.up

    @property
    def n_hot(self) -> int:
        return int(self.hot.sum())

    @property
    def n_learn(self) -> int:
        """Cold slots that may hold hot experts learned while running (csrc/cache/experts_learn.c: all but 2·k)."""
        fit = min(self.n_slots, self.cap // self.slot_bytes) if self.cap else self.n_slots   # as the C cache
        return max(0, fit - max(2 * self.k, self.k + 1)) if self.learn else 0

    @property
    def hot_bytes(self) -> int:
        return self.n_hot * self.slot_bytes

    @property
    def cold_bytes(self) -> int:
        return self.cap or self.n_slots * self.slot_bytes

    def stream_args(self) -> dict:
        return {"cluster": 8, "n_slots": 0, "io": self.io, "queue_depth": self.queue_depth,
                "n_expert_slots": self.n_slots, "expert_hot": self.hot.astype(np.uint8) if self.n_hot else None,
                "expert_ahead": self.ahead, "expert_learn": self.learn, "expert_cold_bytes": self.cap,
                "expert_pre": self.pre}

    @property
    def read_size(self) -> int:
        """Bytes of a typical read as printed: a slice's room in a slot, or in two phases a miss's bytes over its
        expected reads."""
        return int(self.read_bytes_each) if self.two_phase else self.slot_bytes // self.n_slices

    @property
    def io_bound_tps(self) -> float | None:
        if not self.read_mbps:
            return None
        return float("inf") if not self.flash_bytes else self.read_mbps * 1e6 / self.flash_bytes

    def lines(self) -> list:
        total = self.n_layers * self.n_expert
        tps = self.io_bound_tps
        pred = (f"predicted          no device profile ({self.profile_note or 'run pi2 profile-io MODEL'})"
                if tps is None else
                f"predicted          at most {tps:.2f} tokens/s from reads alone ({self.read_mbps:.0f} MB/s at "
                f"{self.read_size // 1024} KiB reads: {self.profile_note})")
        miss = (f"{fmt(int(self.miss_bytes))}: gate rows, then the clusters with an open neuron, against "
                f"{fmt(int(self.whole_bytes))} whole" if self.two_phase else fmt(int(self.miss_bytes)))
        return [f"memory budget      {fmt(self.budget)} (minimum for this model and context: {fmt(self.minimum)})",
                f"runtime            {fmt(self.runtime)} (RSS + page cache of the runtime and the file's metadata)",
                f"fixed region       {fmt(self.fixed)} (mapped: attention, norms, routers, shared experts, "
                f"embeddings, output)",
                f"KV cache           {fmt(self.kv)}",
                f"scratch + margin   {fmt(self.scratch + self.margin)}",
                f"experts            {fmt(self.expert_bytes)} on flash: {self.n_layers} layers x {self.n_expert} "
                f"experts, {self.k} per token",
                f"hot experts        {fmt(self.hot_bytes)}: {self.n_hot} of {total} resident"
                + (" (the routing profile's most used)" if self.n_hot else
                   " (no routing profile: `pi2 profile-experts MODEL` makes one)" if not self.profiled else ""),
                (f"expert cache       {fmt(self.cap)} of slots sized to what is read: about {self.n_effective} "
                 f"experts of {fmt(int(self.held_each))} (gate rows + the clusters tokens opened; whole "
                 f"{fmt(self.slot_bytes)}), shared by all layers, the least routed evicted first "
                 f"({(self.n_effective + self.n_hot) / max(total, 1):.1%} of the experts held; {self.n_slots} slots)"
                 if self.cap else
                 f"expert cache       {self.n_slots} slots of {self.slot_bytes // 1024} KiB = {fmt(self.cold_bytes)}, "
                 f"LRU shared by all layers ({(self.n_slots + self.n_hot) / max(total, 1):.1%} of the experts held; "
                 f"at least {self.min_slots} slots)")
                + (f"; up to {self.n_learn} keep the most routed experts, learned while running"
                   if self.n_learn and self.n_slots < total else ""),
                f"I/O                {self.io}, queue depth {self.queue_depth}, O_DIRECT; next layer's experts "
                f"guessed and read ahead: {'yes' if self.ahead else 'no'}"
                + (f"; with the gate rows, an expert's first {self.as_dict()['pre_clusters']:.0f} clusters on average "
                   f"(opened by most tokens)" if self.pre is not None and self.pre.any() else ""),
                f"hit rate           {self.hit_rate:.1%} expected ("
                + ("routing profile" if self.profiled else "uniform routing: a worst case") + ")",
                f"flash per token    {fmt(self.flash_bytes)} expected ({self.k} experts x {self.n_layers} layers x "
                f"{1 - self.hit_rate:.1%} misses x {miss})",
                pred]

    def as_dict(self) -> dict:
        d = {k: getattr(self, k) for k in ("kind", "budget", "runtime", "fixed", "kv", "scratch", "margin",
                                           "slot_bytes", "min_slots", "n_slots", "n_hot", "hot_bytes", "io",
                                           "queue_depth", "expert_bytes", "hit_rate", "flash_bytes", "read_mbps",
                                           "io_bound_tps", "profiled", "ahead", "learn", "n_learn", "two_phase")}
        d.update(floor=self.minimum, cold_bytes=self.cold_bytes, n_expert=self.n_expert, k=self.k,
                 n_layers=self.n_layers, miss_bytes=int(self.miss_bytes), whole_miss_bytes=int(self.whole_bytes),
                 cap=self.cap, held_each=int(self.held_each), n_effective=self.n_effective or self.n_slots,
                 pre_clusters=round(float(self.pre[self.pre > 0].mean()), 2) if self.pre is not None and
                 (self.pre > 0).any() else 0.0)
        return d


def _hit_rate(freq: np.ndarray, hot: np.ndarray, n_slots: int, k: int) -> float:
    """Expected share of needed experts hot or in the cold slots: hot ones by their routing share; the cold slots
    (shared by all layers) hold about n_slots cold experts, modelled as the n_slots most frequent cold ones (what
    slots sized to what is read keep, as they evict the least routed expert; an LRU keeps the most recent)."""
    rows = freq.sum(axis=1, keepdims=True)
    p = np.where(rows > 0, freq / np.maximum(rows, 1e-300), 0.0)       # per layer: share of routed rows
    layers = int((rows[:, 0] > 0).sum()) or 1
    hot_share = float((p * hot).sum()) / layers
    cold = np.sort((p * ~hot).ravel())[::-1]
    return min(1.0, hot_share + float(cold[:n_slots].sum()) / layers)


def make_expert_plan(model, cmodel, budget: int, n_ctx: int, n_threads: int, io: str = "auto",
                     n_batch: int = 512, ahead: bool = True, type_k: int = 1, type_v: int = 1,
                     two_phase: bool = False) -> ExpertPlan:
    """The budget's split (UsageError when it is below the floor: the fixed region, KV, buffers and k slots);
    type_k: the K cache's ggml type (-ctk); two_phase: a converted file run under the relu rule (a decoded token's
    misses read the gate rows, then only the bundle clusters with an open neuron)."""
    c = model.config
    kv, scratch = context_bytes(cmodel, n_ctx, n_threads, n_batch, type_k, type_v)
    layers = expert_layers(model)
    n_layers = sum(1 for b in layers if b)
    reads = read_bytes(model)
    low, up = runtime_bounds(model)     # checked with the RSS rounded down, the minimum printed with it rounded up
    p = ExpertPlan(budget=budget, runtime=low, up=up - low, fixed=fixed_region(model, n_ctx), kv=kv,
                   scratch=scratch, margin=MARGIN, slot_bytes=slot_bytes(model), n_expert=c.n_expert,
                   k=c.n_expert_used, n_layers=n_layers, n_slots=0, io=io, ahead=ahead,
                   expert_bytes=sum(sum(b) * c.n_expert for b in layers if b),
                   miss_bytes=float(np.mean(reads)) if reads else 0.0)
    p.whole_bytes, p.read_bytes_each = p.miss_bytes, max(reads) if reads else 0
    p.n_slices = 2 if c.expert_bundles else 3
    opened = open_read_bytes(model) if two_phase else None
    if opened:
        p.two_phase, p.miss_bytes = True, float(np.mean(opened))
        p.read_bytes_each = p.miss_bytes / 2     # the gate rows' read and about one merged run of clusters
    if budget < p.floor:
        raise UsageError(f"--memory-budget {budget >> 20}M is below what this model needs with experts streamed "
                         f"({fmt(p.minimum)}: fixed region {fmt(p.fixed)}, KV cache {fmt(kv)}, buffers, and {p.k} "
                         f"expert slots of {fmt(p.slot_bytes)})", hint=f"give --memory-budget {-(-p.minimum >> 20)}M "
                                                                      "or more, or a smaller -c")
    n_total = min((budget - p.floor) // p.slot_bytes + p.min_slots, n_layers * c.n_expert)
    prof = load_profile(model)
    mask = np.array([b is not None for b in layers])[:, None]
    freq = (prof if prof is not None else np.ones((c.n_layer, c.n_expert))) * mask
    p.profiled = prof is not None
    hot = np.zeros((c.n_layer, c.n_expert), bool)
    n_cold = n_total
    if p.profiled:     # the most routed experts resident, keeping 2·k cold slots for the rest
        n_hot = max(0, n_total - MIN_COLD_PER_K * p.k)
        order = np.argsort(-(freq / np.maximum(freq.sum(axis=1, keepdims=True), 1)).ravel(), kind="stable")[:n_hot]
        hot.ravel()[order] = True
        hot &= mask
        n_cold = n_total - int(hot.sum())
    p.hot, p.n_slots = hot, int(max(n_cold, p.min_slots))
    n_lru = p.n_slots
    if p.two_phase:   # slots sized to what is read: the bytes left hold as many experts as their read bytes allow
        p.cap = int(budget - (p.floor - p.min_slots * p.slot_bytes) - p.hot_bytes)
        p.held_each = float(np.mean(open_read_bytes(model, uses=2)))
        room = n_layers * c.n_expert - p.n_hot
        p.n_effective = int(max(p.min_slots, min(room, p.cap // max(p.held_each, 1.0))))
        least = _span(min(b[0] for b in layers if b)) + ALIGN      # gate rows and one page of clusters
        p.n_slots, n_lru = int(max(p.n_effective, min(room, p.cap // least))), p.n_effective
        p.pre = pre_clusters(model)
    p.hit_rate = _hit_rate(freq, hot, n_lru, p.k)
    p.flash_bytes = int(round(n_layers * p.k * (1 - p.hit_rate) * p.miss_bytes))
    p.read_mbps, p.profile_note = cached_throughput(model.path, _align_up(int(p.read_bytes_each)) if reads else ALIGN,
                                                    p.queue_depth)
    return p
