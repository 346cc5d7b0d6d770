"""budget_plan.py — Plan, the record of how a pi2 file runs inside `--memory-budget SIZE` (the floor's parts, the hot
prefix per layer, the cold slots, the gate rows' share, I/O, the expected flash bytes per token), and how `pi2 plan`
prints it (lines, JSON): byte sizes as a user reads them (fmt).
Does not: decide any of it (pi2/plan/budget.py fills it).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

MiB = 1 << 20
QUEUE_DEPTH = 32
EARLY_P = 0.95     # a cold cluster this likely to be needed is read before the layer's attention (n_early)


def fmt(n: int) -> str:
    """Bytes as a user reads them: MiB, or KiB / bytes below a MiB (a budget of 1K is not "0.0 MiB")."""
    if n >= MiB:
        return f"{n / MiB:.1f} MiB"
    return f"{n / 1024:.1f} KiB" if n >= 1024 else f"{n} bytes"


@dataclass
class Plan:
    budget: int
    runtime: int            # RSS of the process with the runtime and the file's metadata loaded
    fixed: int              # mapped tensors the forward pass reads (attention, norms, embeddings, output, gate rows)
    kv: int
    scratch: int
    margin: int
    cluster: int
    slot_bytes: int
    min_slots: int
    n_slots: int
    n_hot: list = field(default_factory=list)
    hot_bytes: int = 0
    io: str = "auto"
    queue_depth: int = QUEUE_DEPTH
    n_ff: int = 0
    ffn_bytes: int = 0      # every layer's bundle region
    npu_bytes: int = 0      # the NPU's copies of the hot prefix (npu_plan.copy_bytes), part of `fixed`
    repacked: int = 0       # part of `fixed`: attention and output copied at load into the packed kernels' layout
                            # (pi2_model_repack; the copies replace their mapped pages, so `fixed` is unchanged)
    flash_bytes: int = 0    # expected bytes read per token: cold clusters with an active neuron (ffn_freq),
                            # and gate_flash_bytes
    read_mbps: float | None = None   # the device profile's throughput at the slot size and queue depth
    profile_note: str = ""
    gate: bool = False      # the gate rows stream too (two-phase loading with the file's predictor)
    gate_whole: bool = False    # the gate rows stream, read whole each token: the budget is below the floor with
                                # them mapped (any rule; no gate hot prefix)
    gate_note: str = ""     # why they do not, under a rule other than the file's predictor
    gate_bytes: int = 0     # every layer's gate region
    gate_slot_bytes: int = 0
    n_gate_slots: int = 0
    n_gate_hot: list = field(default_factory=list)
    gate_hot_bytes: int = 0
    gate_flash_bytes: int = 0   # of flash_bytes: cold gate clusters with a predicted neuron
    pred_share: float = 0.0     # mean predicted share of the neurons (P / n_ff), from the thresholds and cuts
    n_early: list = field(default_factory=list)   # per layer: cold clusters read before attention (>= EARLY_P)
    floor_mapped_gate: int = 0  # gate_whole: the floor with the gate rows mapped (the budget is below it)
    minimum: int = 0            # min_budget: the smallest budget these settings accept (any cluster size)

    @property
    def floor(self) -> int:
        return (self.runtime + self.fixed + self.kv + self.scratch + self.margin + self.min_slots * self.slot_bytes
                + (self.min_slots * self.gate_slot_bytes if self.gate or self.gate_whole else 0))

    @property
    def cold_bytes(self) -> int:
        return self.n_slots * self.slot_bytes

    def stream_args(self) -> dict:
        args = {"cluster": self.cluster, "n_slots": self.n_slots, "n_hot": self.n_hot, "io": self.io,
                "queue_depth": self.queue_depth}
        if self.gate or self.gate_whole:
            args.update(stream_gate=True, n_gate_slots=self.n_gate_slots, n_gate_hot=self.n_gate_hot)
        elif self.n_early:
            args["n_early"] = self.n_early
        return args

    def lines(self) -> list:
        hot = np.asarray(self.n_hot)
        return [f"memory budget      {fmt(self.budget)} (minimum for this model and context: "
                f"{fmt(self.minimum or self.floor)})",
                f"runtime            {fmt(self.runtime)} (RSS + page cache of the runtime and the file's metadata)",
                f"fixed region       {fmt(self.fixed)} (mapped: attention, norms, embeddings, output"
                + (", predictor" if self.gate else "" if self.gate_whole else ", gate rows")
                + (f"; NPU copies {fmt(self.npu_bytes)}" if self.npu_bytes else "")
                + (f"; repacked {fmt(self.repacked)}" if self.repacked else "") + ")",
                f"KV cache           {fmt(self.kv)}",
                f"scratch + margin   {fmt(self.scratch + self.margin)}",
                f"FFN bundles        {fmt(self.ffn_bytes)} on flash",
                f"hot prefix         {fmt(self.hot_bytes)}: {int(hot.sum())} of {self.n_ff * len(hot)} neurons "
                f"({hot.sum() / max(self.n_ff * len(hot), 1):.1%}), per layer {_per_layer(hot)}",
                f"cold cache         {self.n_slots} slots of {self.slot_bytes // 1024} KiB = {fmt(self.cold_bytes)} "
                f"(cluster {self.cluster} neurons; at least {self.min_slots} slots)"] + self.gate_lines() + [
                f"I/O                {self.io}, queue depth {self.queue_depth}, O_DIRECT"
                + (f"; {sum(self.n_early)} clusters per token read before their layer's attention (needed with "
                   f"p >= {EARLY_P})" if sum(self.n_early) else ""),
                f"flash per token    {fmt(self.flash_bytes)} expected (cold clusters with an active neuron, by "
                f"ffn_freq" + (f"; of which gate rows {fmt(self.gate_flash_bytes)}: cold gate clusters with a "
                               f"predicted neuron" if self.gate else
                               f"; of which gate rows {fmt(self.gate_flash_bytes)}, read whole" if self.gate_whole
                               else "") + "; the cold LRU assumed to miss)",
                self.predicted_line()]

    def gate_lines(self) -> list:
        if self.gate_whole:
            return [f"gate rows          {fmt(self.gate_bytes)} on flash, read whole each token (with them mapped "
                    f"the minimum is {fmt(self.floor_mapped_gate)}); {self.n_gate_slots} slots of "
                    f"{self.gate_slot_bytes // 1024} KiB = {fmt(self.n_gate_slots * self.gate_slot_bytes)}"]
        if not self.gate:
            return [f"gate rows          mapped ({self.gate_note})"] if self.gate_note else []
        hot = np.asarray(self.n_gate_hot)
        return [f"gate rows          {fmt(self.gate_bytes)} on flash, streamed with the predictor (predicted share "
                f"{self.pred_share:.1%}): hot {fmt(self.gate_hot_bytes)}, {int(hot.sum())} of "
                f"{self.n_ff * len(hot)} rows ({hot.sum() / max(self.n_ff * len(hot), 1):.1%}), per layer "
                f"{_per_layer(hot)}; cold {self.n_gate_slots} slots of {self.gate_slot_bytes // 1024} KiB = "
                f"{fmt(self.n_gate_slots * self.gate_slot_bytes)}"]

    @property
    def read_seconds(self) -> float:
        """Seconds per token the expected reads take at the profiled throughput (inf without a profile)."""
        return self.flash_bytes / (self.read_mbps * 1e6) if self.read_mbps else float("inf")

    @property
    def io_bound_tps(self) -> float | None:
        """Tokens/s the reads alone allow (None without a device profile; inf when nothing is read)."""
        if not self.read_mbps:
            return None
        return float("inf") if not self.flash_bytes else self.read_mbps * 1e6 / self.flash_bytes

    def predicted_line(self) -> str:
        tps = self.io_bound_tps
        if tps is None:
            return f"predicted          no device profile ({self.profile_note or 'run pi2 profile-io MODEL'})"
        if tps == float("inf"):
            return "predicted          no flash reads while decoding: the speed of the mapped run"
        return (f"predicted          at most {tps:.2f} tokens/s from reads alone ({self.read_mbps:.0f} MB/s at "
                f"{self.slot_bytes // 1024} KiB, qd {self.queue_depth}: {self.profile_note}); compute adds to it "
                f"where it does not overlap")

    def as_dict(self) -> dict:
        d = {k: getattr(self, k) for k in ("budget", "runtime", "fixed", "kv", "scratch", "margin", "cluster",
                                           "slot_bytes", "min_slots", "n_slots", "hot_bytes", "io", "queue_depth",
                                           "ffn_bytes", "npu_bytes", "gate")}
        d.update(floor=self.minimum or self.floor, cold_bytes=self.cold_bytes, n_hot=[int(h) for h in self.n_hot],
                 n_early=[int(e) for e in self.n_early], flash_bytes=self.flash_bytes, read_mbps=self.read_mbps, io_bound_tps=self.io_bound_tps)
        if self.gate:
            d.update({k: getattr(self, k) for k in ("gate_bytes", "gate_slot_bytes", "n_gate_slots", "gate_hot_bytes",
                                                    "gate_flash_bytes", "pred_share")})
            d["n_gate_hot"] = [int(h) for h in self.n_gate_hot]
        return d


def _per_layer(hot) -> str:
    if len(set(hot.tolist())) == 1:
        return f"{int(hot[0])} each"
    return f"{int(hot.min())}..{int(hot.max())}"
