"""devices.py — `pi2 devices`: what this machine offers pi2, measured or read, never assumed.

Owns: the CPU (cores, core clusters by maximum frequency, features from /proc/cpuinfo, the kernels
pi2_kernel_isa reports), memory (MemTotal / MemAvailable, the memory cgroup's limit when there is one),
the flash I/O backends (the verdicts of pi2_io_probe, run on the model file or, without one, on a
temporary file: which work, which overlap reads, which a seccomp filter refuses, and the one `--io auto`
picks), whether a model file's file system gives O_DIRECT (pi2_io_open's own decision: an O_DIRECT open,
statx, one 4 KiB aligned read), and NNAPI (its devices with types and feature levels, or why it is not
available).
Does not: change anything on the machine or choose a plan.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from pi2 import flash_io
from pi2.engine import kernel_info
from pi2.engine_nnapi import NnapiDelegate
from pi2.errors import EngineError, Pi2Error, UsageError

# /proc/cpuinfo flag -> the name pi2 prints (x86 "flags", aarch64 "Features")
_FEATURES = {"asimd": "neon", "asimddp": "dotprod", "i8mm": "i8mm", "sve": "sve", "avx2": "avx2", "fma": "fma",
             "f16c": "f16c", "avx512f": "avx512", "avx512_vnni": "avx512vnni"}
_NO_LIMIT = 1 << 60   # cgroup v1 reports "no limit" as a huge number


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def cpu_info(cpuinfo: str | None = None) -> dict:
    text = _read("/proc/cpuinfo") if cpuinfo is None else cpuinfo
    flags, model = set(), ""
    for line in text.splitlines():
        key, _, val = line.partition(":")
        key = key.strip().lower()
        if key in ("flags", "features"):
            flags |= set(val.split())
        elif key in ("model name", "hardware") and not model:
            model = val.strip()
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        usable = os.cpu_count() or 1
    clusters: dict = {}
    for cpu in sorted(Path("/sys/devices/system/cpu").glob("cpu[0-9]*")):
        f = _read(str(cpu / "cpufreq/cpuinfo_max_freq")).strip()
        if f.isdigit():
            clusters[int(f) // 1000] = clusters.get(int(f) // 1000, 0) + 1
    ki = kernel_info()
    return {"model": model, "cores": os.cpu_count() or 1, "usable_cores": usable,
            "clusters_mhz": {str(k): v for k, v in sorted(clusters.items(), reverse=True)},
            "features": sorted({name for flag, name in _FEATURES.items() if flag in flags}),
            "kernels": ki["isa"] or ["ref"], "variant": ki["variant"], "variant_why": ki["variant_why"],
            "packed": ki["packed"]}


def cgroup_limit(proc_cgroup: str | None = None, root: str = "/sys/fs/cgroup") -> int | None:
    """The memory cgroup's limit in bytes (v2 memory.max or v1 memory.limit_in_bytes), None if unlimited."""
    text = _read("/proc/self/cgroup") if proc_cgroup is None else proc_cgroup
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, ctrls, rel = parts
        rel = rel.lstrip("/")
        if ctrls == "" and os.path.exists(os.path.join(root, "cgroup.controllers")):            # v2
            cands = [os.path.join(root, rel, "memory.max")]
        elif "memory" in ctrls.split(","):                                                        # v1
            cands = [os.path.join(root, "memory", rel, "memory.limit_in_bytes")]
        else:
            continue
        for c in cands:
            v = _read(c).strip()
            if v.isdigit() and int(v) < _NO_LIMIT:
                return int(v)
    return None


def memory_info(meminfo: str | None = None) -> dict:
    text = _read("/proc/meminfo") if meminfo is None else meminfo
    kb = {}
    for line in text.splitlines():
        key, _, val = line.partition(":")
        if val.strip().endswith("kB"):
            kb[key.strip()] = int(val.split()[0]) * 1024
    return {"total": kb.get("MemTotal"), "available": kb.get("MemAvailable"), "cgroup_limit": cgroup_limit()}


def memory_limit(meminfo: str | None = None) -> int | None:
    """What this process may hold: MemAvailable plus what it holds already (VmRSS), capped by its memory cgroup's
    limit; None when /proc/meminfo cannot be read."""
    info = memory_info(meminfo)
    if not info["available"]:
        return None
    rss = next((int(line.split()[1]) * 1024 for line in _read("/proc/self/status").splitlines()
                if line.startswith("VmRSS:")), 0)
    limit = info["available"] + rss
    return min(limit, info["cgroup_limit"]) if info["cgroup_limit"] else limit


def io_backends(path: Path | None = None) -> dict:
    """The probe's verdict on every backend, on `path` or a temporary 1 MiB file in the temp directory."""
    tmp = None
    if path is None:
        fd, tmp = tempfile.mkstemp(prefix="pi2-probe-", suffix=".bin")
        with os.fdopen(fd, "wb") as fh:
            fh.write(os.urandom(1 << 20))
            fh.flush()
            os.fsync(fh.fileno())
    try:
        res = flash_io.probe(tmp or path)
    finally:
        if tmp:
            os.unlink(tmp)
    return {"probed_on": "a temporary file in " + os.path.dirname(tmp) if tmp else str(path), "chosen": res.chosen,
            "backends": [{"name": v.backend, "status": v.status, "reason": v.reason, "direct": v.direct}
                         for v in res.verdicts]}


def o_direct(path: Path) -> dict:
    """Whether pi2 reads `path` with O_DIRECT (pi2_io_open: the open, statx, a first aligned read), and why not."""
    try:
        with flash_io.FlashFile(path, "pread", queue_depth=1, direct=True) as f:
            info = f.info
    except EngineError as e:
        raise UsageError(str(e)) from None
    return {"path": str(path), "supported": info["direct"], "detail": info["note"]}


def nnapi_info(lib_path: str | None = None) -> dict:
    try:
        d = NnapiDelegate(lib_path)
    except Pi2Error as e:
        return {"available": False, "reason": str(e)}
    devs = [{k: v for k, v in dev.items() if k != "selected"} for dev in d.devices()]
    return {"available": True, "runtime_feature_level": d.runtime_feature_level, "devices": devs}


def report(model: Path | None = None, lib_path: str | None = None) -> dict:
    rep = {"cpu": cpu_info(), "memory": memory_info()}
    if model is not None:
        rep["o_direct"] = o_direct(model)     # first: a missing model is a usage error before any probe
    rep["io"] = io_backends(model)
    rep["nnapi"] = nnapi_info(lib_path)
    return rep


def _mib(n) -> str:
    return "unknown" if n is None else f"{n / 2 ** 20:.0f} MiB"


def format_text(rep: dict) -> str:
    c, m = rep["cpu"], rep["memory"]
    clusters = ", ".join(f"{n} x {mhz} MHz" for mhz, n in c["clusters_mhz"].items()) or "unknown"
    lines = [f"cpu:       {c['model'] or 'unknown'}",
             f"cores:     {c['cores']} ({c['usable_cores']} usable); clusters by max frequency: {clusters}",
             f"features:  {', '.join(c['features']) or 'none of neon, dotprod, i8mm, avx2, avx512'}",
             f"kernels:   {', '.join(c['kernels'])}",
             f"variant:   {c['variant']} ({c['variant_why']}); repacked at load: {', '.join(c['packed']) or 'none'}",
             f"memory:    total {_mib(m['total'])}, available {_mib(m['available'])}, cgroup limit "
             + (_mib(m["cgroup_limit"]) if m["cgroup_limit"] else "none"),
             "io:        " + ", ".join(f"{b['name']} ({b['status']})" for b in rep["io"]["backends"])
             + f"; --io auto picks {rep['io']['chosen'] or 'nothing'} (probed on {rep['io']['probed_on']})"]
    lines += [f"  {b['name']}: {b['reason']}" for b in rep["io"]["backends"]]
    if "o_direct" in rep:
        od = rep["o_direct"]
        lines.append(f"o_direct:  {'yes' if od['supported'] else 'no'} on {od['path']} ({od['detail']})")
    n = rep["nnapi"]
    if not n["available"]:
        reason = n["reason"].removeprefix("NNAPI unavailable: ")
        lines.append(f"nnapi:     not available ({reason})")
    else:
        lines.append(f"nnapi:     runtime feature level {n['runtime_feature_level']}, {len(n['devices'])} device(s)")
        lines += [f"  {d['name']}: {d['type']}, feature level {d['feature_level']}" for d in n["devices"]]
    return "\n".join(lines)


def show(model: Path | None, lib_path: str | None, as_json: bool) -> None:
    rep = report(model, lib_path)
    print(json.dumps(rep, indent=2) if as_json else format_text(rep))
