"""flash_io.py — the Python side of csrc/io/: the `--io auto|uring|aio|pread|mmap` choice, the backend
probe (run once per process and file system), and FlashFile, a thin handle over the pi2_io_* reads.

Owns: spelling and validation of backend names, turning the probe's verdicts into records, resolving
`auto` to the probe's choice, aligned buffers for tests and tools.
Does not: read bytes in Python loops (C does), or time anything itself (pi2_io_bench).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from pi2.errors import EngineError, UsageError

BACKENDS = ("uring", "aio", "pread", "mmap")             # probe order; the ids follow pi2_io_backend
_IDS = {"auto": 0, "uring": 1, "aio": 2, "pread": 3, "mmap": 4}
_ALIASES = {"io_uring": "uring", "linux-aio": "aio", "libaio": "aio"}
VERDICTS = ("ok", "serial", "refused", "unavailable", "failed")   # pi2_io_verdict_code order
ALIGN = 4096
PROBE_BUFFERED, PROBE_TEST_SECCOMP_URING, PROBE_TEST_RAISE_SIGSYS = 1, 2, 4
TEST_DIRECT_OPEN_EINVAL, TEST_DIRECT_READ_EINVAL = 1, 2


def parse_io(value: str) -> str:
    """The backend a `--io` value names: auto, uring, aio, pread or mmap (io_uring, linux-aio accepted)."""
    v = _ALIASES.get(value.strip().lower(), value.strip().lower())
    if v not in _IDS:
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


def probe(path: str | os.PathLike, *, buffered: bool = False, test_flags: int = 0, fresh: bool = False) -> ProbeResult:
    """Run pi2_io_probe on `path` (children try every backend; this process never calls io_uring
    itself). Results are kept per file system and flags for the life of the process."""
    from pi2.engine import check, ffi, lib
    path = str(path)
    try:
        st = os.stat(path)
    except OSError as e:
        raise UsageError(f"cannot probe I/O on {path}: {e.strerror}") from None
    flags = (PROBE_BUFFERED if buffered else 0) | test_flags
    key = (st.st_dev, flags)
    if not fresh and key in _probed:
        return _probed[key]
    out = ffi.new("pi2_io_verdict[]", len(BACKENDS))
    chosen = ffi.new("int32_t *")
    check(lib.pi2_io_probe(path.encode(), flags, out, chosen))
    verdicts = tuple(Verdict(backend=BACKENDS[v.backend - 1], status=VERDICTS[v.verdict],
                             reason=ffi.string(v.reason).decode("utf-8", "replace"), signal=v.signal,
                             direct=bool(v.direct), read_us=round(v.read_us, 1), batch_us=round(v.batch_us, 1),
                             submit_us=round(v.submit_us, 1)) for v in out)
    res = ProbeResult(path, BACKENDS[chosen[0] - 1] if chosen[0] else None, verdicts)
    if not test_flags:
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
    import numpy as np
    raw = np.zeros(nbytes + ALIGN, dtype=np.uint8)
    skip = (-raw.ctypes.data) % ALIGN
    return raw[skip:skip + nbytes]


@dataclass(frozen=True)
class Completion:
    user: int
    nbytes: int
    error: int        # 0 or an errno (EINVAL, EBADF, EIO, ENODATA)


class FlashFile:
    """One file open for aligned reads through one backend (pi2_io_*). Not thread-safe."""

    def __init__(self, path: str | os.PathLike, backend: str = "pread", queue_depth: int = 32, direct: bool = True,
                 drop_cache: bool = True, test_flags: int = 0):
        from pi2.engine import check, ffi, lib
        self._ffi, self._lib, self._check = ffi, lib, check
        name = parse_io(backend)
        if name == "auto":
            raise UsageError("FlashFile needs a backend; resolve auto with flash_io.resolve first")
        p = ffi.new("pi2_io_params *", {"backend": _IDS[name], "queue_depth": queue_depth, "direct": int(direct),
                                        "drop_cache": int(drop_cache), "test_flags": test_flags})
        h = ffi.new("pi2_io **")
        check(lib.pi2_io_open(str(Path(path)).encode(), p, h))
        self._h = h[0]
        self._held: dict = {}     # user -> destination kept alive while in flight
        i = ffi.new("pi2_io_info *")
        check(lib.pi2_io_get_info(self._h, i))
        self.info = {"backend": name, "direct": bool(i.direct), "queue_depth": i.queue_depth, "fd": i.fd,
                     "file_size": i.file_size, "note": ffi.string(i.note).decode()}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        if self._h is not None:
            self._lib.pi2_io_close(self._h)
            self._h = None
            self._held.clear()

    def _handle(self):
        if self._h is None:
            raise UsageError("the file is closed")
        return self._h

    def _reqs(self, requests):
        ffi = self._ffi
        reqs = ffi.new("pi2_io_request[]", max(len(requests), 1))
        for i, (offset, length, dest, user) in enumerate(requests):
            reqs[i].offset, reqs[i].length, reqs[i].user = offset, length, user
            reqs[i].dest = ffi.from_buffer(dest, require_writable=True)
        return reqs

    def submit(self, requests) -> int:
        """Queue (offset, length, dest buffer, user) requests; return how many were accepted."""
        h = self._handle()
        reqs = self._reqs(requests)
        n = self._ffi.new("int32_t *")
        self._check(self._lib.pi2_io_submit(h, reqs, len(requests), n))
        for offset, length, dest, user in requests[:n[0]]:
            self._held[user] = dest
        return n[0]

    def reap(self, max_n: int = 64, min_complete: int = 1) -> list:
        h = self._handle()
        out = self._ffi.new("pi2_io_completion[]", max(max_n, 1))
        n = self._ffi.new("int32_t *")
        self._check(self._lib.pi2_io_reap(h, out, max_n, min_complete, n))
        got = [Completion(out[i].user, out[i].nbytes, out[i].error) for i in range(n[0])]
        for c in got:
            self._held.pop(c.user, None)
        return got

    @property
    def in_flight(self) -> int:
        return self._lib.pi2_io_in_flight(self._handle())

    def read_all(self, requests) -> list:
        """Completions of (offset, length, dest, user) requests, in request order."""
        h = self._handle()
        reqs = self._reqs(requests)
        out = self._ffi.new("pi2_io_completion[]", max(len(requests), 1))
        self._check(self._lib.pi2_io_read_all(h, reqs, len(requests), out))
        return [Completion(out[i].user, out[i].nbytes, out[i].error) for i in range(len(requests))]

    def drop_cache(self) -> None:
        self._check(self._lib.pi2_io_drop_cache(self._handle()))

    def bench(self, block: int, queue_depth: int, seconds: float, seed: int = 1) -> dict:
        """pi2_io_bench: random aligned reads of `block` bytes, queue_depth in flight, for `seconds`."""
        out = self._ffi.new("pi2_io_bench_result *")
        self._check(self._lib.pi2_io_bench(self._handle(), block, queue_depth, seconds, seed, out))
        return {"reads": out.reads, "bytes": out.bytes, "errors": out.errors, "seconds": out.seconds}
