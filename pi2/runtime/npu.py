"""npu.py — whether and how a run uses the NNAPI delegate (`--npu auto|nnapi|off`).

Owns: the mode rule for plain files' prompt batches (auto: only when NNAPI lists a GPU or accelerator
device and the F16 weight copies take at most half of MemAvailable; nnapi: any device NNAPI lists,
including its CPU driver, with a one-line note and a CPU run when NNAPI is unavailable; off), and for pi2
files the hot prefix of decode, by pi2/plan/npu_plan.py's decision (the one `pi2 plan` prints);
attaching the delegate to a C context, the fields bench reports, and the notes `--verbose` prints
(why the delegate was not used or fell back to the CPU).
Does not: build graphs (csrc/nnapi_graph.c) or read the environment (the CLI passes --nnapi-lib).
"""
from __future__ import annotations

import sys

from pi2.errors import UsageError

MODES = ("auto", "nnapi", "off")
MIN_BATCH = 8        # prompt batches of fewer tokens stay on the CPU (NNAPI's per-call overhead dominates)


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise UsageError(f"unknown --npu '{mode}' (choose from {', '.join(MODES)})")
    return mode


def check_gbps(gbps: float | None) -> float | None:
    """--npu-gbps: a positive throughput, or None (measure it)."""
    if gbps is not None and not gbps > 0:
        raise UsageError(f"invalid --npu-gbps {gbps:g}: a positive throughput in GB/s")
    return gbps


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
    if check_mode(mode) == "off":
        return None, ""
    from pi2.engine_nnapi import NnapiDelegate
    from pi2.errors import Pi2Error
    try:
        d = NnapiDelegate(lib_path, accelerators_only=(mode == "auto"))
    except Pi2Error as e:
        return None, str(e)
    if not any(dev["selected"] for dev in d.devices()):
        names = ", ".join(f"{dev['name']} ({dev['type']})" for dev in d.devices()) or "none"
        return None, f"NNAPI has no GPU or accelerator device (devices: {names})"
    return d, ""


def attach(ctx, mode: str, lib_path: str | None = None, model=None, npu_gbps: float | None = None,
           room: int | None = None) -> None:
    """Give a C context's prompt batches (plain files) or its decode's hot prefix (pi2 `model`s) to NNAPI per
    `mode`; sets ctx.npu_state and ctx.npu_notes. room: bytes a pi2 file's copies may take (None: half of
    MemAvailable under auto). --npu nnapi that cannot be honoured prints one note on stderr and the run
    continues on the CPU."""
    ctx.npu_state, ctx.npu_notes, ctx.npu_devices = "off", [], ""
    if model is not None and model.config.pi2:
        _attach_hot(ctx, model, mode, lib_path, npu_gbps, room)
        return
    d, reason = open_delegate(mode, lib_path)
    avail, need = mem_available(), copy_bytes(ctx.cfg)
    if d is not None and mode == "auto" and avail is not None and need > avail // 2:
        d, reason = None, (f"the F16 weight copies for NNAPI ({need >> 20} MiB) would take more than half of the "
                           f"available memory ({avail >> 20} MiB)")
    if d is not None:
        from pi2.engine_nnapi import ctx_set_nnapi
        from pi2.errors import Pi2Error
        try:
            ctx_set_nnapi(ctx, d, MIN_BATCH)
        except Pi2Error as e:
            d, reason = None, str(e)
    if d is None:
        ctx.npu_notes += [reason] if reason else []
        if mode == "nnapi":
            print(f"pi2: note: --npu nnapi: {reason}; running on the CPU", file=sys.stderr)
        return
    ctx.npu_state = "nnapi"
    ctx.npu_devices = ",".join(dev["name"] for dev in d.devices() if dev["selected"])


def _attach_hot(ctx, model, mode: str, lib_path, npu_gbps, room) -> None:
    from pi2.plan.npu_plan import decide
    d, reason = open_delegate(mode, lib_path)
    if room is None and mode == "auto" and mem_available() is not None:
        room = mem_available() // 2
    dec = decide(model, mode, d, reason, ctx.n_threads, room, npu_gbps)
    ctx.npu_plan = dec
    if dec.use:
        from pi2.engine_nnapi import ctx_set_npu_ffn
        from pi2.errors import Pi2Error
        try:
            ctx_set_npu_ffn(ctx, d, dec.n_hot)
        except Pi2Error as e:
            dec.use, dec.reason = False, str(e)
    if not dec.use:
        ctx.npu_notes += [dec.reason] if mode != "off" else []
        if mode == "nnapi":
            print(f"pi2: note: --npu nnapi: {dec.reason}; running on the CPU", file=sys.stderr)
        return
    ctx.npu_state, ctx.npu_devices = "nnapi", dec.devices


def no_c_engine(ctx, mode: str) -> None:
    """A context of the reference engine: NNAPI does not apply."""
    ctx.npu_state, ctx.npu_devices = "off", ""
    ctx.npu_notes = [] if mode == "off" else ["the reference engine does not use NNAPI"]
    if mode == "nnapi":
        print("pi2: note: --npu nnapi: the reference engine does not use NNAPI; running on the CPU", file=sys.stderr)


def notes(ctx) -> list:
    """Why NNAPI was not used, or fell back to the CPU (for --verbose)."""
    out = list(getattr(ctx, "npu_notes", []))
    d = getattr(ctx, "_nnapi", None)
    return out + (d.notes() if d is not None else [])


def bench_fields(ctx) -> dict:
    """pi2_npu* fields of a bench record: state, devices, weight-copy bytes, products run / handed back."""
    state = getattr(ctx, "npu_state", "off")
    fields = {"npu": state, "npu_devices": getattr(ctx, "npu_devices", "")}
    if state == "nnapi":
        from pi2.engine_nnapi import ctx_nnapi_stats, ctx_npu_ffn_stats
        s, h = ctx_nnapi_stats(ctx), ctx_npu_ffn_stats(ctx)
        fields.update(npu_bytes=s["bytes"] + h["bytes"], npu_runs=s["runs"] + h["runs"],
                      npu_fallbacks=s["fallbacks"] + h["fallbacks"])
    return fields
