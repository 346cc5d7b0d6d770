"""faultfs.py — a FUSE file system for the I/O fault tests: it serves one directory read-only and fails its reads
on command, so every read backend (io_uring, AIO, pread, mmap) meets real kernel errors mid-run: the error comes
back through the kernel exactly as a failing device's would (an errno for read calls and io_uring/AIO completions,
SIGBUS for a mapping).

Usage: python -m tests.faults.faultfs SRC_DIR MOUNTPOINT CONTROL_FILE
CONTROL_FILE holds one JSON object, read again on every request (a test arms a fault by rewriting it):
  {"mode": "none" | "eio" | "short" | "stall", "after": reads to let through first (default 0),
   "count": faulty reads at most (default: all after), "stall_s": seconds a stalled read sleeps (default 1)}
"after" and "count" count each reading process apart (the kernel names the thread; its Tgid is the process), so
several runs can meet one rule at once.
eio fails the read with EIO; short returns half the bytes asked for; stall sleeps, then answers correctly (a new
rule ends a stall at once: a test releases a read that "never returns" that way).
Each new rule also moves the file's reported mtime, so the kernel drops its cached pages of the file (mapped ones
too: FUSE's auto_inval_data) at the next stat: a mapping reads through the file system again, as after the page
cache was evicted.
The server logs (mfusepy's messages) to stderr: give it a file, not a pipe nobody reads (a full pipe blocks the
server, and the client then waits for its answer forever).
Every request is logged in CONTROL_FILE + ".log" as `offset length ok|MODE PID` (the test truncates it when it
writes a new rule).
"""
from __future__ import annotations

import errno
import json
import os
import sys
import threading
import time

import mfusepy as fuse


class FaultFS(fuse.Operations):
    use_ns = True

    def __init__(self, src: str, control: str):
        self.src, self.control = src, control
        self._mutex = threading.Lock()       # not `lock`: that name is FUSE's POSIX-lock operation
        self.stamp, self.seen, self.hits, self.generation = None, {}, {}, 0

    def _rule(self) -> dict:
        try:
            st = os.stat(self.control)
            with open(self.control) as f:
                rule = json.load(f)
        except (OSError, ValueError):
            return {"mode": "none"}
        if (st.st_mtime_ns, st.st_ino) != self.stamp:     # a new rule: count from zero
            self.stamp, self.seen, self.hits = (st.st_mtime_ns, st.st_ino), {}, {}
            self.generation += 1
        return rule

    def _stall(self, seconds: float) -> None:
        stamp, end = self.stamp, time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(0.05)
            with self._mutex:
                self._rule()
                if self.stamp != stamp:
                    return

    def _process(self) -> int:
        """The process of the thread the request came from (0 when unknown)."""
        tid = fuse.fuse_get_context()[2]       # looked up every time: thread ids are reused by later processes
        try:
            with open(f"/proc/{tid}/status") as f:
                return next(int(ln.split()[1]) for ln in f if ln.startswith("Tgid:"))
        except (OSError, StopIteration, ValueError):
            return tid

    def _real(self, path: str) -> str:
        return os.path.join(self.src, path.lstrip("/"))

    def getattr(self, path, fh=None):
        st = os.lstat(self._real(path))
        d = {k: getattr(st, k) for k in ("st_mode", "st_nlink", "st_size", "st_uid", "st_gid")}
        with self._mutex:
            self._rule()
            moved = self.generation * 1_000_000_000
        d.update(st_atime=st.st_atime_ns, st_mtime=st.st_mtime_ns + moved, st_ctime=st.st_ctime_ns)
        d["st_mode"] &= ~0o222
        return d

    def readdir(self, path, fh):
        return [".", ".."] + os.listdir(self._real(path))

    def open(self, path, flags):
        if flags & (os.O_WRONLY | os.O_RDWR):
            raise fuse.FuseOSError(errno.EROFS)
        return os.open(self._real(path), os.O_RDONLY)

    def release(self, path, fh):
        os.close(fh)
        return 0

    def read(self, path, size, offset, fh):
        with self._mutex:
            r = self._rule()
            mode, who = r.get("mode", "none"), self._process()
            seen, hits = self.seen.get(who, 0), self.hits.get(who, 0)
            hit = mode != "none" and seen >= int(r.get("after", 0)) and hits < int(r.get("count", 1 << 62))
            self.seen[who], self.hits[who] = seen + 1, hits + hit
            with open(self.control + ".log", "a") as log:
                log.write(f"{offset} {size} {mode if hit else 'ok'} {who}\n")
        if hit and mode == "eio":
            raise fuse.FuseOSError(errno.EIO)
        if hit and mode == "stall":
            self._stall(float(r.get("stall_s", 1.0)))
        data = os.pread(fh, size, offset)
        if hit and mode == "short":
            data = data[:len(data) // 2]
        return data


def main(argv: list) -> None:
    src, mnt, control = argv
    fuse.FUSE(FaultFS(os.path.abspath(src), os.path.abspath(control)), mnt, foreground=True, ro=True,
              default_permissions=True, kernel_cache=False, auto_cache=False, attr_timeout=0, entry_timeout=0)


if __name__ == "__main__":
    main(sys.argv[1:])
