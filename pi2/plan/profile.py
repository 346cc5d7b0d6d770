"""profile.py — the device read-throughput profile: random 4 KiB-aligned reads by block size × queue depth
on a given file (the model), measured once per device and file system and cached as JSON.

Owns: the grid (block sizes, queue depths), the cache location and key
(<cache>/devices/dev<major>-<minor>-fs<fsid>.json), reuse versus `--refresh`, the table text, and the cached
throughput nearest a read size and queue depth (the planner's).
Does not: time reads (pi2_io_bench in C runs every timed loop) or pick a plan from the numbers.
The page cache never serves a measured read: O_DIRECT when the file system allows it, else each range
read is dropped (posix_fadvise DONTNEED) and the whole file is dropped before every point.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import os
from pathlib import Path

from pi2.engine import flash_io
from pi2.errors import FileError, UsageError

VERSION = 1
BLOCKS = (4096, 8192, 16384, 32768, 65536, 131072, 524288)
DEPTHS = (1, 4, 16, 32)
SECONDS = 0.3          # per point


def default_cache_dir() -> Path:
    return Path.home() / ".cache" / "pi2"


def device_key(path: str | os.PathLike) -> str:
    """The file's device and file system: dev<major>-<minor>-fs<f_fsid as hex>."""
    try:
        st, vfs = os.stat(path), os.statvfs(path)
    except OSError as e:
        raise FileError(f"cannot read {path}: {e.strerror}") from None
    return f"dev{os.major(st.st_dev)}-{os.minor(st.st_dev)}-fs{vfs.f_fsid:x}"


def cache_file(path: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> Path:
    return Path(cache_dir or default_cache_dir()) / "devices" / f"{device_key(path)}.json"


def measure(path: str | os.PathLike, io: str = "auto", seconds: float = SECONDS, blocks=BLOCKS,
            depths=DEPTHS) -> dict:
    """Measure every (block, queue depth) point on `path` with the backend `io` resolves to."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as e:
        raise FileError(f"cannot read {path}: {e.strerror}") from None
    if size < 4096:
        raise FileError(f"{path} is smaller than one 4 KiB block: nothing to measure")
    backend, probe = flash_io.resolve(io, path)
    points = []
    with flash_io.FlashFile(path, backend, queue_depth=max(depths), direct=True, drop_cache=True) as f:
        for block in blocks:
            for qd in depths:
                if block > size:
                    points.append({"block": block, "qd": qd, "mb_s": None, "iops": None, "reads": 0, "errors": 0})
                    continue
                r = f.bench(block, qd, seconds, seed=block * 131 + qd)
                points.append({"block": block, "qd": qd, "mb_s": round(r["bytes"] / r["seconds"] / 1e6, 1),
                               "iops": round(r["reads"] / r["seconds"]), "reads": r["reads"], "errors": r["errors"]})
        info = dict(f.info)
    return {"version": VERSION, "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "device": device_key(path), "file": str(path), "file_size": size, "backend": backend,
            "direct": info["direct"], "open_note": info["note"], "seconds_per_point": seconds,
            "probe": None if probe is None else {"chosen": probe.chosen,
                                                 "verdicts": {v.backend: v.status for v in probe.verdicts}},
            "points": points}


def _matches(prof: dict, io: str, blocks, depths) -> bool:
    return (prof.get("version") == VERSION and (io == "auto" or prof.get("backend") == io)
            and {(p["block"], p["qd"]) for p in prof.get("points", [])} >= {(b, q) for b in blocks for q in depths})


def load_or_measure(path: str | os.PathLike, *, refresh: bool = False, io: str = "auto",
                    cache_dir: str | os.PathLike | None = None, seconds: float = SECONDS, blocks=BLOCKS,
                    depths=DEPTHS) -> tuple:
    """(profile, reused): the cached profile of path's device when it covers the grid and backend asked
    for, else a fresh measurement written to the cache (atomically: temp file, then rename)."""
    io = flash_io.parse_io(io)
    cf = cache_file(path, cache_dir)
    if not refresh and cf.exists():
        try:
            prof = json.loads(cf.read_text())
        except (OSError, ValueError):
            prof = None
        if isinstance(prof, dict) and _matches(prof, io, blocks, depths):
            return prof, True
    prof = measure(path, io, seconds, blocks, depths)
    try:
        cf.parent.mkdir(parents=True, exist_ok=True)
        tmp = cf.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(prof, indent=1) + "\n")
        os.replace(tmp, cf)
    except OSError as e:
        raise FileError(f"cannot write the device profile {cf}: {e.strerror}") from None
    return prof, False


def throughput(prof: dict, block: int, qd: int) -> float | None:
    """MB/s measured at (block, qd), None when not measured."""
    return next((p["mb_s"] for p in prof["points"] if p["block"] == block and p["qd"] == qd), None)


def _size(n: int) -> str:
    return f"{n // 1024}K" if n < 1 << 20 else f"{n >> 20}M"


def format_table(prof: dict, cache: Path | None = None, reused: bool = False) -> str:
    blocks = sorted({p["block"] for p in prof["points"]})
    depths = sorted({p["qd"] for p in prof["points"]})
    how = "O_DIRECT" if prof["direct"] else f"buffered, page cache dropped ({prof['open_note']})"
    lines = [f"device {prof['device']}: {prof['backend']}, {how}; measured {prof['date']} on {prof['file']}"
             + (f" (cached: {cache})" if reused and cache else ""),
             "random reads, MB/s (IOPS)",
             "| block | " + " | ".join(f"QD {q}" for q in depths) + " |",
             "|---:|" + "---:|" * len(depths)]
    for b in blocks:
        cells = []
        for q in depths:
            p = next(p for p in prof["points"] if p["block"] == b and p["qd"] == q)
            cells.append("-" if p["mb_s"] is None else f"{p['mb_s']:.0f} ({p['iops']})"
                         + (f" {p['errors']} errors" if p["errors"] else ""))
        lines.append(f"| {_size(b)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def show(path: Path, *, refresh: bool, io: str, as_json: bool, cache_dir: str | None, seconds: float) -> None:
    prof, reused = load_or_measure(path, refresh=refresh, io=io, cache_dir=cache_dir, seconds=seconds)
    print(json.dumps(prof, indent=1) if as_json else format_table(prof, cache_file(path, cache_dir), reused))


def cached_throughput(path, block: int, qd: int) -> tuple:
    """(MB/s, note) from the cached device profile of path's device (pi2 profile-io), at the measured block size
    nearest `block` and the measured queue depth nearest `qd`; (None, why) when there is none."""
    try:
        prof = json.loads(cache_file(path).read_text())
        points = [p for p in prof["points"] if p.get("mb_s")]
    except (OSError, ValueError, KeyError, TypeError, UsageError):
        return None, "run pi2 profile-io MODEL to measure this device"
    if not points:
        return None, "the device profile has no measured points"
    b = min({p["block"] for p in points}, key=lambda x: abs(math.log2(x / block)))
    q = min({p["qd"] for p in points if p["block"] == b}, key=lambda x: abs(x - qd))
    mbps = next(p["mb_s"] for p in points if p["block"] == b and p["qd"] == q)
    return float(mbps), f"device profile, {b // 1024} KiB reads at qd {q}, {prof.get('backend', '?')}"
