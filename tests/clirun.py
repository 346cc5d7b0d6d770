"""clirun.py — helpers for the CLI tests: run `pi2` in process (pi2.cli.main.main with captured stdio) or as a
subprocess, check the one-line error contract, patch GGUF headers, hash files.
"""
from __future__ import annotations

import hashlib
import io
import re
import signal
import struct
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from pi2.cli.main import main

ERROR_RE = re.compile(r"^pi2: error: \S.*$")
HINT_RE = re.compile(r"^  hint: \S.*$")
# main() names the exception type only for failures nothing in pi2 anticipated
UNEXPECTED_RE = re.compile(r"^pi2: error: [A-Za-z_.]*(Error|Exception|Interrupt|Exit|Abort)\b: ")


@dataclass
class Result:
    code: int
    out_bytes: bytes
    err: str

    @property
    def out(self) -> str:
        return self.out_bytes.decode("utf-8", "surrogateescape")


@contextmanager
def time_limit(seconds: int):
    """Fail instead of hanging."""
    def boom(*_):
        raise TimeoutError(f"pi2 did not finish within {seconds} s")
    old = signal.signal(signal.SIGALRM, boom)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def cli(*args, stdin: str = "", timeout: int = 30) -> Result:
    """Run `pi2 ARGS` in this process. stdout is a strict UTF-8 stream (as in a UTF-8 terminal)."""
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict", write_through=True)
    err = io.StringIO()
    saved = sys.stdin, sys.stdout, sys.stderr
    sys.stdin, sys.stdout, sys.stderr = io.StringIO(stdin), out, err
    code = 0
    try:
        with time_limit(timeout):
            main([str(a) for a in args])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved
    out.flush()
    return Result(code, out.buffer.getvalue(), err.getvalue())


def cli_process(*args, stdin: bytes = b"", timeout: int = 60, **kw) -> Result:
    """Run `python -m pi2 ARGS` as a child process."""
    p = subprocess.run([sys.executable, "-m", "pi2", *[str(a) for a in args]], input=stdin,
                       capture_output=True, timeout=timeout, **kw)
    return Result(p.returncode, p.stdout, p.stderr.decode("utf-8", "replace"))


def assert_error(res: Result, code: int = 1, match: str | None = None) -> str:
    """The error contract: exit `code`, nothing on stdout, stderr = one `pi2: error:` line (+ a hint line),
    no traceback, and an anticipated error (not a bare exception type). Returns the message line."""
    assert res.code == code, (res.code, res.err)
    assert "Traceback" not in res.err, res.err
    lines = res.err.splitlines()
    assert 1 <= len(lines) <= 2, res.err
    assert ERROR_RE.match(lines[0]), res.err
    assert not UNEXPECTED_RE.match(lines[0]), res.err
    if len(lines) == 2:
        assert HINT_RE.match(lines[1]), res.err
    assert res.out_bytes == b"", res.out
    if match is not None:
        assert re.search(match, lines[0]), lines[0]
    return lines[0]


TIMING_RES = [
    re.compile(r"^\w+:        load time = +\d+\.\d\d ms$"),
    re.compile(r"^\w+: prompt eval time = +\d+\.\d\d ms / +\d+ tokens \( +\d+\.\d\d ms per token, +\d+\.\d\d "
               r"tokens per second\)$"),
    re.compile(r"^\w+:        eval time = +\d+\.\d\d ms / +\d+ runs   \( +\d+\.\d\d ms per token, +\d+\.\d\d "
               r"tokens per second\)$"),
    re.compile(r"^\w+:       total time = +\d+\.\d\d ms / +\d+ tokens$"),
]


def timing_counts(err: str) -> dict:
    """Check llama.cpp's four timing lines are on stderr, in order; return their token/run counts."""
    lines = err.splitlines()
    at = []
    for rx in TIMING_RES:
        hits = [i for i, line in enumerate(lines) if rx.match(line)]
        assert len(hits) == 1, (rx.pattern, err)
        at.append(hits[0])
    assert at == sorted(at), err
    n = lambda i: int(re.search(r"/ +(\d+) ", lines[i] + " ").group(1))  # noqa: E731
    return {"prompt": n(at[1]), "eval": n(at[2]), "total": n(at[3])}


def sha256(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# --- GGUF header surgery on fixture files (little-endian, GGUF v3) ---

def gguf_str(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def tensor_info(blob: bytes, name: str) -> dict:
    """Byte positions of a tensor-info record's fields: {'name', 'ne': [...], 'type', 'offset'}."""
    pos = blob.index(gguf_str(name))
    p = pos + 8 + len(name.encode())
    n_dims = struct.unpack_from("<I", blob, p)[0]
    ne = [p + 4 + 8 * i for i in range(n_dims)]
    t = p + 4 + 8 * n_dims
    return {"name": pos + 8, "ne": ne, "type": t, "offset": t + 4}


def kv_value_pos(blob: bytes, key: str) -> int:
    """Position of a scalar KV's value (after the key and its u32 type)."""
    return blob.index(gguf_str(key)) + 8 + len(key.encode()) + 4


def patched(src, dst, edits) -> Path:
    """Copy src to dst with edits [(position, bytes), ...] applied."""
    b = bytearray(Path(src).read_bytes())
    for pos, data in edits:
        b[pos:pos + len(data)] = data
    Path(dst).write_bytes(bytes(b))
    return Path(dst)
