"""engine/flash_io.py — the Python side of csrc/io/: the `--io auto|uring|aio|pread|mmap` choice, the backend
probe (run once per process and file system), and FlashFile, a handle on one file opened by a backend (its info,
the timed reads of pi2_io_bench).

Owns: spelling and validation of backend names, turning the probe's verdicts into records, resolving
`auto` to the probe's choice, aligned buffers for tests and tools.
Does not: read bytes in Python loops (C does), or time anything itself (pi2_io_bench). The reads one by one
(submit, reap) are test entry points (pi2_test.h; tests/ctest.py).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pi2.engine.lib import check, enum, ffi, lib
from pi2.errors import EngineError, UsageError

BACKENDS = ("uring", "aio", "pread", "mmap")             # probe order
IDS = enum("PI2_IO_", ("auto",) + BACKENDS)              # pi2_io_backend
_NAMES = {v: k for k, v in IDS.items()}
_ALIASES = {"io_uring": "uring", "linux-aio": "aio", "libaio": "aio"}
_VERDICT_IDS = enum("PI2_IO_VERDICT_", ("ok", "serial", "refused", "unavailable", "failed"))
VERDICTS = tuple(_VERDICT_IDS)
_VERDICT_NAMES = {v: k for k, v in _VERDICT_IDS.items()}
ALIGN = lib.PI2_IO_ALIGN


def parse_io(value: str) -> str:
    """The backend a `--io` value names: auto, uring, aio, pread or mmap (io_uring, linux-aio accepted)."""
    v = _ALIASES.get(value.strip().lower(), value.strip().lower())
    if v not in IDS:
        raise UsageError(f"--io must be one of auto, uring, aio, pread, mmap, not {value!r}")
    return v


@dataclass(frozen=True)
class Verdict:
    backend: str      # uring | aio | pread | mmap
    status: str       # ok | serial | refused | unavailable | failed
    reason: str       # one line from the probe child (or about its death)
    signal: int       # the signal that killed the child (refused), else 0
    direct: bool      # the child read with O_DIRECT
    read_us: float    # one 4 KiB read alone (median)
    batch_us: float   # 16 reads submitted together, until the last completed
    submit_us: float  # of which inside submit

    @property
    def usable(self) -> bool:
        return self.status in ("ok", "serial")


@dataclass(frozen=True)
class ProbeResult:
    path: str
    chosen: str | None           # first ok backend, else first serial one, else None
    verdicts: tuple

    def verdict(self, backend: str) -> Verdict:
        return next(v for v in self.verdicts if v.backend == backend)


_probed: dict = {}


def probe(path: str | os.PathLike, *, buffered: bool = False, fresh: bool = False, _run=None) -> ProbeResult:
    """Run pi2_io_probe on `path` (children try every backend; this process never calls io_uring
    itself). Results are kept per file system and flags for the life of the process. _run: a test's probe call
    (tests/ctest.py, with test switches), whose result is not kept."""
    path = str(path)
    try:
        st = os.stat(path)
    except OSError as e:
        raise UsageError(f"cannot probe I/O on {path}: {e.strerror}") from None
    flags = lib.PI2_IO_PROBE_BUFFERED if buffered else 0
    key = (st.st_dev, flags)
    if not fresh and _run is None and key in _probed:
        return _probed[key]
    out = ffi.new("pi2_io_verdict[]", lib.PI2_IO_N_BACKENDS)
    chosen = ffi.new("int32_t *")
    check((_run or lib.pi2_io_probe)(path.encode(), flags, out, chosen))
    verdicts = tuple(Verdict(backend=_NAMES[v.backend], status=_VERDICT_NAMES[v.verdict],
                             reason=ffi.string(v.reason).decode("utf-8", "replace"), signal=v.signal,
                             direct=bool(v.direct), read_us=round(v.read_us, 1), batch_us=round(v.batch_us, 1),
                             submit_us=round(v.submit_us, 1)) for v in out)
    res = ProbeResult(path, _NAMES[chosen[0]] if chosen[0] != IDS["auto"] else None, verdicts)
    if _run is None:
        _probed[key] = res
    return res


def resolve(requested: str, path: str | os.PathLike) -> tuple:
    """(backend, probe result or None) for a `--io` value on the file `path`. auto takes the probe's
    choice; uring needs a probe that saw it work (it may kill the process otherwise); the others are
    used as asked (opening reports what fails)."""
    name = parse_io(requested)
    if name not in ("auto", "uring"):
        return name, None
    res = probe(path)
    if name == "auto":
        if res.chosen is None:
            raise EngineError("no I/O backend works here: " + "; ".join(f"{v.backend}: {v.reason}" for v in res.verdicts))
        return res.chosen, res
    v = res.verdict("uring")
    if not v.usable:
        raise UsageError(f"--io uring is not usable here: {v.reason}", hint="use --io auto")
    return "uring", res


def aligned(nbytes: int):
    """A zeroed numpy uint8 array of nbytes starting on a 4 KiB boundary."""
    raw = np.zeros(nbytes + ALIGN, dtype=np.uint8)
    skip = (-raw.ctypes.data) % ALIGN
    return raw[skip:skip + nbytes]


@dataclass(frozen=True)
class Completion:
    """A finished read (pi2_io_completion), as tests see them."""
    user: int
    nbytes: int
    error: int        # 0 or an errno (EINVAL, EBADF, EIO, ENODATA)


class FlashFile:
    """One file open for aligned reads through one backend (pi2_io_open): its info (backend, O_DIRECT, the note on
    how it was opened, size) and the timed random reads of the device profile (bench). Not thread-safe."""

    def __init__(self, path: str | os.PathLike, backend: str = "pread", queue_depth: int = 32, direct: bool = True,
                 drop_cache: bool = True):
        name = parse_io(backend)
        if name == "auto":
            raise UsageError("FlashFile needs a backend; resolve auto with flash_io.resolve first")
        p = ffi.new("pi2_io_params *", {"backend": IDS[name], "queue_depth": queue_depth, "direct": int(direct),
                                        "drop_cache": int(drop_cache)})
        h, i = ffi.new("pi2_io **"), ffi.new("pi2_io_info *")
        check(self._open(str(Path(path)).encode(), p, h, i))
        self._h = h[0]
        self.info = {"backend": name, "direct": bool(i.direct), "queue_depth": i.queue_depth, "fd": i.fd,
                     "file_size": i.file_size, "note": ffi.string(i.note).decode()}

    def _open(self, path: bytes, params, handle, info) -> int:   # tests open with test switches (tests/ctest.py)
        return lib.pi2_io_open(path, params, handle, info)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        if self._h is not None:
            lib.pi2_io_close(self._h)
            self._h = None

    def _handle(self):
        if self._h is None:
            raise UsageError("the file is closed")
        return self._h

    def bench(self, block: int, queue_depth: int, seconds: float, seed: int = 1) -> dict:
        """pi2_io_bench: random aligned reads of `block` bytes, queue_depth in flight, for `seconds` (a buffered handle
        drops the file from the page cache first)."""
        out = ffi.new("pi2_io_bench_result *")
        check(lib.pi2_io_bench(self._handle(), block, queue_depth, seconds, seed, out))
        return {"reads": out.reads, "bytes": out.bytes, "errors": out.errors, "seconds": out.seconds}
