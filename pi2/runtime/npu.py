"""npu.py — whether and how a run uses the NNAPI delegate (`--npu auto|nnapi|off`).

Owns: the mode rule for plain files' prompt batches (auto: only when NNAPI lists a GPU or accelerator
device and the F16 weight copies take at most half of MemAvailable; nnapi: any device NNAPI lists,
including its CPU driver, with a one-line note and a CPU run when NNAPI is unavailable; off), and for pi2
files the hot prefix of decode, by pi2/plan/npu_plan.py's decision (the one `pi2 plan` prints);
the run's record of it (NpuUse: planned by plan_npu, applied to a C context by attach), the fields bench reports,
and the notes `--verbose` prints (why the delegate was not used or fell back to the CPU).
Does not: build graphs (csrc/nnapi/) or read the environment (the CLI passes --nnapi-lib).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field

from pi2.engine.nnapi import NnapiDelegate, ctx_nnapi_stats, ctx_npu_ffn_stats, ctx_set_nnapi, ctx_set_npu_ffn
from pi2.errors import Pi2Error
from pi2.plan.npu_plan import NpuDecision, decide

MIN_BATCH = 8        # prompt batches of fewer tokens stay on the CPU (NNAPI's per-call overhead dominates)


@dataclass
class NpuUse:
    """What a run does with NNAPI and why. plan_npu fills it before the context exists; attach applies it.
    state is "nnapi" once a context computes on the delegate; notes say why it does not (--verbose)."""
    mode: str
    state: str = "off"
    devices: str = ""
    notes: list = field(default_factory=list)
    delegate: NnapiDelegate | None = None     # opened, to attach; kept as long as the session
    decision: NpuDecision | None = None       # pi2 files: the hot prefix on the NPU (what `pi2 plan` prints)
    why_not: str = ""                         # why no delegate was planned ("" when one was, or with --npu off)

    @property
    def hot(self) -> bool:
        """The decision gives decode's hot prefix to the NPU (pi2 files)."""
        return self.decision is not None and self.decision.use

    def note(self, reason: str) -> None:
        """A reason NNAPI is not used; --npu nnapi says it on stderr at once, since it was asked for."""
        if reason and self.mode != "off":
            self.notes.append(reason)
        if self.mode == "nnapi":
            print(f"pi2: note: --npu nnapi: {reason}; running on the CPU", file=sys.stderr)


def copy_bytes(cfg) -> int:
    """Bytes of the F16 copies of every layer matrix the delegate takes (q, k, v, output, gate, up, down)."""
    attn = cfg.n_embd * (cfg.n_head * cfg.head_dim + cfg.n_head_kv * (cfg.head_dim + cfg.head_dim_v)
                         + cfg.n_head * cfg.head_dim_v)
    return 2 * cfg.n_layer * (attn + 3 * cfg.n_ff * cfg.n_embd)


def mem_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def open_delegate(mode: str, lib_path: str | None = None):
    """(delegate or None, reason when None) for `mode`; never raises for a missing or broken NNAPI."""
    if mode == "off":
        return None, ""
    try:
        d = NnapiDelegate(lib_path, accelerators_only=(mode == "auto"))
    except Pi2Error as e:
        return None, str(e)
    if not any(dev["selected"] for dev in d.devices()):
        names = ", ".join(f"{dev['name']} ({dev['type']})" for dev in d.devices()) or "none"
        return None, f"NNAPI has no GPU or accelerator device (devices: {names})"
    return d, ""


def plan_batches(model, mode: str, lib_path: str | None) -> NpuUse:
    """A plain file on the C engine: its prompt batches go to NNAPI per `mode` (attach hands them over)."""
    use = NpuUse(mode)
    d, reason = open_delegate(mode, lib_path)
    avail, need = mem_available(), copy_bytes(model.config)
    if d is not None and mode == "auto" and avail is not None and need > avail // 2:
        d, reason = None, (f"the F16 weight copies for NNAPI ({need >> 20} MiB) would take more than half of the "
                           f"available memory ({avail >> 20} MiB)")
    use.delegate, use.why_not = d, reason if d is None else ""
    return use


def plan_hot(model, mode: str, lib_path: str | None, threads: int, room: int | None,
             npu_gbps: float | None) -> NpuUse:
    """A pi2 file: whether decode's hot prefix goes to NNAPI (npu_plan.decide). room: bytes the copies may take
    (None: half of MemAvailable under auto)."""
    use = NpuUse(mode)
    d, reason = open_delegate(mode, lib_path)
    if room is None and mode == "auto" and mem_available() is not None:
        room = mem_available() // 2
    use.decision = decide(model, mode, d, reason, threads, room, npu_gbps)
    use.delegate = d if use.decision.use else None
    use.why_not = "" if use.decision.use else use.decision.reason
    return use


def for_reference(mode: str) -> NpuUse:
    """A context of the reference engine: NNAPI does not apply."""
    return NpuUse(mode, why_not="the reference engine does not use NNAPI")


def attach(ctx, use: NpuUse) -> None:
    """Hand a C context's prompt batches (plain files) or its decode's hot prefix (pi2 files) to the delegate
    `use` planned (ctx None: a reference context); without one, or when that fails, the context stays on the CPU
    with the reason in use.notes."""
    if ctx is None or use.delegate is None:
        use.note(use.why_not)
        return
    try:
        if use.hot:
            ctx_set_npu_ffn(ctx, use.delegate, use.decision.n_hot)
        else:
            ctx_set_nnapi(ctx, use.delegate, MIN_BATCH)
    except Pi2Error as e:
        if use.hot:
            use.decision.use, use.decision.reason = False, str(e)
        use.delegate = None
        use.note(str(e))
        return
    use.state = "nnapi"
    use.devices = use.decision.devices if use.hot else \
        ",".join(dev["name"] for dev in use.delegate.devices() if dev["selected"])


def notes(use: NpuUse) -> list:
    """Why NNAPI was not used, or fell back to the CPU (for --verbose)."""
    return list(use.notes) + (use.delegate.notes() if use.delegate is not None else [])


def bench_fields(ctx, use: NpuUse) -> dict:
    """pi2_npu* fields of a bench record: state, devices, weight-copy bytes, products run / handed back."""
    fields = {"npu": use.state, "npu_devices": use.devices}
    if use.state == "nnapi":
        s, h = ctx_nnapi_stats(ctx), ctx_npu_ffn_stats(ctx)
        fields.update(npu_bytes=s["bytes"] + h["bytes"], npu_runs=s["runs"] + h["runs"],
                      npu_fallbacks=s["fallbacks"] + h["fallbacks"])
    return fields
