"""npu_plan.py — whether a pi2 file's decode hands each layer's hot prefix to NNAPI, and how many neurons.

Owns: the cost model of PowerInfer-2's decode split, the choice of the hot count H per layer, the bytes of
the NPU copies, the predicted gain, and the `--npu` rule that `pi2 plan` and `pi2 run` share (`decide`):
  auto   NNAPI only when it selected a GPU or accelerator device, a layer gains, and the copies fit;
  nnapi  any device NNAPI lists; H is the gainful choice, else the neurons active for most tokens;
  off    never.
Cost model, per layer and token (FFN only; attention and flash reads are the same either way):
  CPU alone   t_cpu = (F·gate_row + Σ_i f_i·(up_row + down_row)) / cpu_rate
  CPU + NPU   t_hyb(H) = max(6·H·n_embd / npu_rate,  (F·gate_row + Σ_{i>=H} f_i·(up_row + down_row)) / cpu_rate)
f_i: the file's activation frequencies (blk.L.ffn_freq); the NPU computes its H neurons densely from F16
copies (2 bytes x 3 matrices) while the CPU computes every gate row and the active cold neurons.
Rates: the NPU's is measured on the opened delegate (one hot-FFN graph, best of 5 runs, its per-call cost
included) unless --npu-gbps gives one; NPU_DEFAULT_GBPS when neither is available. The CPU's is measured
with pi2's kernels on layer 0's up rows (one thread) times the thread count.
Does not: open the library (pi2/runtime/npu.py) or build graphs (csrc/nnapi/hot_ffn.c).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from pi2 import engine
from pi2.errors import Pi2Error
from pi2.model.ffn_layout import bundle_layout, row_bytes
from pi2.plan.budget import bundle_ud_gap

GROUP = 64                 # H is a multiple of PI2_FFN_GROUP (or n_ff)
NPU_DEFAULT_GBPS = 10.0    # GB/s of F16 weights, a phone NPU's GEMV at batch 1 when nothing was measured
MIN_GAIN = 1.05            # auto: the predicted FFN speed-up must be at least this
HOT_FREQ = 0.5             # nnapi without a gainful H: the neurons active for at least half of the tokens


def copy_bytes(n_embd: int, n_ff: int, n_hot: list) -> int:
    """Bytes csrc/nnapi/hot_ffn.c and nnapi/graph.c hold for these hot counts: per layer with H > 0 the F16 gate, up
    and down copies, the zero bias and the input/output staging; per context one output and one index list."""
    per = [2 * (3 * h * n_embd + max(n_embd, h) + 2 * n_embd) for h in n_hot if h > 0]
    return sum(per) + (4 * n_embd + 4 * n_ff if per else 0)


@dataclass
class NpuDecision:
    mode: str
    use: bool = False
    reason: str = ""                  # why the NPU is not used ("" when it is)
    devices: str = ""
    n_hot: list = field(default_factory=list)
    n_ff: int = 0
    bytes: int = 0                    # the NPU copies (copy_bytes), counted against --memory-budget
    npu_gbps: float | None = None
    npu_source: str = ""
    cpu_gbps: float | None = None
    t_cpu_ms: float = 0.0             # predicted FFN time per token, CPU alone
    t_hybrid_ms: float = 0.0          # ... with the hot prefix on the NPU

    @property
    def gain(self) -> float:
        return self.t_cpu_ms / self.t_hybrid_ms if self.t_hybrid_ms > 0 else 1.0

    def lines(self) -> list:
        if not self.t_cpu_ms:
            return [f"npu                off ({self.reason})" if self.reason else "npu                off"]
        hot = np.asarray(self.n_hot)
        state = f"nnapi on {self.devices}" if self.use else f"off ({self.reason})"
        return [f"npu                {state}",
                f"npu hot prefix     {int(hot.sum())} of {self.n_ff * len(hot)} neurons, per layer "
                f"{int(hot.min())}..{int(hot.max())}; F16 copies {self.bytes / 2 ** 20:.1f} MiB",
                f"npu predicted      FFN {self.t_cpu_ms:.3f} ms/token on the CPU alone, {self.t_hybrid_ms:.3f} ms with "
                f"the NPU in parallel (x{self.gain:.2f}); NPU {self.npu_gbps:.2f} GB/s ({self.npu_source}), CPU "
                f"{self.cpu_gbps:.2f} GB/s (measured)"]

    def as_dict(self) -> dict:
        d = {k: getattr(self, k) for k in ("mode", "use", "reason", "devices", "bytes", "npu_gbps", "npu_source",
                                           "cpu_gbps", "t_cpu_ms", "t_hybrid_ms")}
        d.update(n_hot=[int(h) for h in self.n_hot], gain=self.gain)
        return d


def supported(model) -> str:
    """Why a pi2 file's hot prefix cannot go to NNAPI ("" when it can)."""
    cfg = model.config
    why = bundle_ud_gap(model, "the hot prefix on NNAPI")
    if why:
        return why
    if cfg.ffn_act not in ("silu", "relu"):
        return f"NNAPI has no graph for the {cfg.ffn_act} activation (SiLU and ReLU have)"
    if "blk.0.ffn_down_scale.weight" in model.file.tensors:
        return "the hot prefix on NNAPI does not take int8 down rows (files made with --ffn-type q8_0 do)"
    return ""


def _layer_costs(model, il: int) -> tuple:
    """(gate row bytes, up + down row bytes, activation frequencies) of layer il."""
    cfg = model.config
    lay = bundle_layout(model, il)
    gate = row_bytes(model.tensor(f"blk.{il}.ffn_gate.weight").type, cfg.n_embd)
    ud = row_bytes(lay["up_type"], cfg.n_embd) + row_bytes(lay["down_type"], cfg.n_embd)
    freq = np.asarray(model.raw(f"blk.{il}.ffn_freq.weight")).view(np.float32).reshape(-1)[:cfg.n_ff]
    return gate, ud, np.clip(freq.astype(np.float64), 0.0, 1.0)


def measure_cpu_gbps(model, threads: int) -> float:
    """GB/s of up rows pi2's kernels read (layer 0, up to 1024 rows, best of 3) on one thread, times threads."""
    lay, e = bundle_layout(model, 0), model.config.n_embd
    nu = row_bytes(lay["up_type"], e)
    rec = model.raw("blk.0.ffn_bundle.weight")
    rows = np.ascontiguousarray(rec[:1024, lay["up_offset"]:lay["up_offset"] + nu])
    x = np.random.default_rng(0).standard_normal(e).astype(np.float32)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        engine.matvec(rows, lay["up_type"], e, x)
        best = min(best, time.perf_counter() - t0)
    return rows.nbytes / max(best, 1e-9) / 1e9 * max(threads, 1)


def measure_npu_gbps(delegate, act: str, n_embd: int, n_hot: int = 256) -> float | None:
    """GB/s of F16 weights one hot-FFN graph of n_hot neurons runs at on `delegate` (best of 5 runs after the
    compiling one), None when the graph fails."""
    try:
        best = delegate.bench_ffn(act, n_embd, n_hot, runs=5)
    except Pi2Error:
        return None
    if best is None:
        return None
    return 6 * n_hot * n_embd / max(best, 1e-9) / 1e9


def _choose(gate: int, ud: int, freq, E: int, cpu: float, npu: float) -> tuple:
    """(H, t_cpu, t_hyb(H)) in seconds: the H (multiple of GROUP, or F) with the least t_hyb, the least H on ties."""
    F = len(freq)
    cold = np.concatenate([np.cumsum((freq * ud)[::-1])[::-1], [0.0]])      # cold[H] = Σ_{i>=H} f_i·ud
    t_cpu = (F * gate + cold[0]) / cpu
    best = (0, t_cpu, t_cpu)
    for h in sorted(set(range(GROUP, F, GROUP)) | {F}):
        t = max(6 * h * E / npu, (F * gate + cold[h]) / cpu)
        if t < best[2]:
            best = (h, t_cpu, t)
    return best


def _hot_by_freq(freq) -> int:
    F = len(freq)
    n = int(np.argmin(freq >= HOT_FREQ)) if not np.all(freq >= HOT_FREQ) else F
    return min(F, max(GROUP, -(-n // GROUP) * GROUP))


def _fit(n_hot: list, E: int, F: int, room: int) -> list:
    """n_hot with the largest counts cut by GROUP until copy_bytes fits in room."""
    h = list(n_hot)
    while h and copy_bytes(E, F, h) > room and max(h) > 0:
        i = int(np.argmax(h))
        h[i] = max(0, (h[i] - 1) // GROUP * GROUP)
    return h


def decide(model, mode: str, delegate, why_not: str, threads: int, room: int | None = None,
           npu_gbps: float | None = None) -> NpuDecision:
    """The `--npu` decision for a pi2 file's decode. delegate: an opened NnapiDelegate or None (why_not says why);
    room: bytes the copies may take (None: no limit)."""
    dec = NpuDecision(mode=mode)
    if mode == "off":
        dec.reason = "--npu off"
        return dec
    why = supported(model) or (why_not if delegate is None else "")
    if delegate is None and not why:
        why = "NNAPI was not opened"
    cfg = model.config
    E, F = cfg.n_embd, cfg.n_ff
    if why:
        dec.reason = why
        return dec
    dec.devices = ",".join(d["name"] for d in delegate.devices() if d["selected"])
    if npu_gbps is not None:
        dec.npu_gbps, dec.npu_source = float(npu_gbps), "--npu-gbps"
    else:
        dec.npu_gbps = measure_npu_gbps(delegate, cfg.ffn_act, E)
        dec.npu_source = "measured on this delegate"
        if dec.npu_gbps is None:
            dec.npu_gbps, dec.npu_source = NPU_DEFAULT_GBPS, "default: the measuring graph failed"
    dec.cpu_gbps = measure_cpu_gbps(model, threads)
    cpu, npu = dec.cpu_gbps * 1e9, dec.npu_gbps * 1e9
    costs = [_layer_costs(model, il) for il in range(cfg.n_layer)]
    picks = [_choose(g, ud, f, E, cpu, npu) for g, ud, f in costs]
    hot = [p[0] for p in picks]
    if mode == "nnapi" and not any(hot):
        hot = [_hot_by_freq(f) for _g, _ud, f in costs]
    wanted = any(hot)
    if room is not None:
        hot = _fit(hot, E, F, room)
    dec.n_hot, dec.n_ff = hot, F
    dec.bytes = copy_bytes(E, F, hot)
    cold = [np.concatenate([np.cumsum((f * ud)[::-1])[::-1], [0.0]]) for _g, ud, f in costs]
    dec.t_cpu_ms = 1e3 * sum(p[1] for p in picks)
    dec.t_hybrid_ms = 1e3 * sum(max(6 * h * E / npu, (F * g + c[h]) / cpu) if h else (F * g + c[0]) / cpu
                                for h, (g, _ud, _f), c in zip(hot, costs, cold))
    if not any(hot):
        dec.reason = f"the NPU copies do not fit in the {room / 2 ** 20:.1f} MiB left" if wanted else \
            "no layer is predicted to gain from the NPU"
    elif mode == "auto" and dec.gain < MIN_GAIN:
        dec.reason = f"the predicted FFN gain x{dec.gain:.2f} is below x{MIN_GAIN}"
    else:
        dec.use = True
    return dec
