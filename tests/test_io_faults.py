"""test_io_faults.py — I/O faults in the middle of a run, for every read backend (io_uring, AIO, pread, mmap):
reads failing with EIO, returning short or stalling (a FUSE file system, tests/faults/faultfs.py, makes the kernel
deliver them), and the model file truncated or replaced while pi2 runs (a plain file). Every fault is injected while
the run is paused (SIGSTOP) after its first generated token. Each must end in a clean one-line error naming the file
and the errno, or, for a short stall or a replacement, the same tokens; a read that never returns must not keep
Ctrl-C from working; never a hang and never a token the clean run does not emit.
PI2_FAULT_TABLE=FILE writes the fault x backend table (markdown) there."""
from __future__ import annotations

import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fixtures import write_model
from pi2file import convert_pi2

ROOT = Path(__file__).resolve().parents[1]
BACKENDS = ("uring", "aio", "pread", "mmap")
ARGS = ["-p", "Once upon a time", "-n", "24", "--temp", "0", "--ignore-eos", "-c", "128", "-t", "1"]
TABLE: dict = {}
N_TOKENS = 200          # long enough that the run is still going when it is paused after its first token


def _fuse_ok() -> str:
    if not os.path.exists("/dev/fuse") or not shutil.which("fusermount3"):
        return "no /dev/fuse or fusermount3 (apt-get install fuse3)"
    try:
        import mfusepy  # noqa: F401
    except (ImportError, OSError) as e:
        return f"mfusepy unusable: {e}"
    return ""


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = tmp_path_factory.mktemp("faults")
    src = write_model(d / "src.gguf", wtype="Q8_0", n_embd=128, n_ff=1024, n_layer=3, seed=11)
    pi2 = convert_pi2(src, d / "m.pi2.gguf", down_type="Q8_0", default_keep=0.5)
    # the minimum as the run's own process measures it (the test process's RSS would leave every neuron hot)
    plan = subprocess.run([sys.executable, "-m", "pi2", "plan", "-m", str(pi2), "--memory-budget", "1G", "-c", "128",
                           "-t", "1", "--io", "pread", "--json"], capture_output=True, text=True, cwd=ROOT, check=True)
    floor = json.loads(plan.stdout)["floor"]
    return pi2, f"{(floor >> 20) + 1}M"


def pi2_run(path, budget, backend, n=24):
    args = [a if a != "24" else str(n) for a in ARGS]
    return subprocess.Popen([sys.executable, "-m", "pi2", "run", str(path), *args, "--memory-budget", budget,
                             "--io", backend], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)


def finish(p, timeout=120):
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        return -1, out, err.decode(errors="replace") + "\n(hung: killed)"
    return p.returncode, out, err.decode(errors="replace")


def error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.startswith("pi2: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def record(fault, backend, outcome):
    TABLE.setdefault(fault, {})[backend] = outcome
    dst = os.environ.get("PI2_FAULT_TABLE")
    if dst:
        rows = ["| fault | " + " | ".join(BACKENDS) + " |", "|---|" + "---|" * len(BACKENDS)]
        rows += [f"| {f} | " + " | ".join(TABLE[f].get(b, "") for b in BACKENDS) + " |" for f in TABLE]
        Path(dst).write_text("\n".join(rows) + "\n")


@pytest.fixture(scope="module")
def clean(model):
    path, budget = model
    out = {}
    for b in BACKENDS:
        code, o, err = finish(pi2_run(path, budget, b, n=N_TOKENS))
        if code != 0 and b in ("uring", "aio") and "not usable" in err:
            continue
        assert code == 0, err
        out[b] = o
    assert len(set(out.values())) == 1, out      # every backend, the same tokens
    return out


class Mount:
    def __init__(self, src: Path, root: Path):
        self.mnt, self.ctl = root / "mnt", root / "control.json"
        self.mnt.mkdir()
        self.arm({"mode": "none"})
        self.log = root / "faultfs.err"          # a file: a pipe nobody reads would block the server when full
        with open(self.log, "wb") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "tests.faults.faultfs", str(src.parent),
                                          str(self.mnt), str(self.ctl)], cwd=ROOT, stdout=subprocess.DEVNULL,
                                         stderr=err)
        deadline = time.monotonic() + 20
        while not os.path.ismount(self.mnt):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("faultfs did not mount: " + self.log.read_text(errors="replace"))
            time.sleep(0.05)
        self.path = self.mnt / src.name

    def arm(self, rule: dict) -> None:
        Path(str(self.ctl) + ".log").write_text("")
        tmp = self.ctl.with_suffix(".tmp")
        tmp.write_text(json.dumps(rule))
        os.replace(tmp, self.ctl)          # a new inode: faultfs counts from zero

    def hits(self) -> list:
        """The faulty requests since the last arm."""
        return [ln for ln in Path(str(self.ctl) + ".log").read_text().splitlines() if not ln.endswith(" ok")]

    def close(self) -> None:
        if subprocess.run(["fusermount3", "-u", str(self.mnt)], check=False).returncode:
            subprocess.run(["fusermount3", "-u", "-z", str(self.mnt)], check=False)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def fuse_mount(model, tmp_path_factory):
    why = _fuse_ok()
    if why:
        pytest.skip(why)
    m = Mount(model[0], tmp_path_factory.mktemp("fuse"))
    yield m
    m.close()


def start_paused(path, budget, backend):
    """A run of N_TOKENS, paused (SIGSTOP) once its first generated token is out; (process, bytes so far)."""
    p = pi2_run(path, budget, backend, n=N_TOKENS)
    head = b""
    while len(head) < len(b"Once upon a time") + 1:
        chunk = os.read(p.stdout.fileno(), 1)
        assert chunk, p.communicate()[1].decode()
        head += chunk
    p.send_signal(signal.SIGSTOP)
    assert p.poll() is None, "finished before the fault"
    return p, head


def arm_paused(mount, rule) -> None:
    """Arm a fault for a paused run: from now on every read of the file meets it (stat: the kernel drops its
    cached pages of the file, so a mapping reads through the file system too, as after an eviction)."""
    mount.arm(rule)
    os.stat(mount.path)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fault", ["eio", "short", "stall"])
def test_read_fault_mid_run(fuse_mount, model, clean, backend, fault):
    if backend not in clean:
        pytest.skip(f"{backend} is not usable here")
    want, budget = clean[backend], model[1]
    fuse_mount.arm({"mode": "none"})
    p, head = start_paused(fuse_mount.path, budget, backend)
    arm_paused(fuse_mount, {"mode": fault, "count": 2 if fault == "stall" else 1 << 30, "stall_s": 1.5})
    t0 = time.monotonic()
    p.send_signal(signal.SIGCONT)
    code, rest, err = finish(p)
    got = head + rest
    assert fuse_mount.hits(), f"the fault never fired: {err}"
    assert want.startswith(got), (got, want)                 # never a token the clean run does not emit
    if fault == "stall":                                      # through FUSE, slowed, unharmed
        assert code == 0 and got == want and time.monotonic() - t0 >= 1.5, err
        record(fault, backend, f"same {len(want)} bytes, {time.monotonic() - t0:.1f} s")
        return
    assert code == 1, (code, err)
    line = error_line(err)
    assert str(fuse_mount.path) in line, line
    errno_text = re.search(r"(Input/output error|No data available|short read)", line)
    assert errno_text, line
    assert not line.startswith("pi2: error: EngineError"), line
    record(fault, backend, f"exit 1 after {len(got)}/{len(want)} bytes: {errno_text.group(1)}")


def read_until(p, stream, text: bytes, timeout: float) -> bytes:
    got, end = b"", time.monotonic() + timeout
    while text not in got and time.monotonic() < end:
        if select.select([stream], [], [], 0.1)[0]:
            chunk = os.read(stream.fileno(), 4096)
            if not chunk:
                break
            got += chunk
    return got


@pytest.mark.parametrize("backend", BACKENDS)
def test_read_never_returns(fuse_mount, model, clean, backend):
    """A read that does not return (a stalled device): Ctrl-C still ends the run at once with `pi2: interrupted`,
    and the process exits 130 as soon as the kernel gives the read back (it cannot be cancelled)."""
    if backend not in clean:
        pytest.skip(f"{backend} is not usable here")
    want, budget = clean[backend], model[1]
    fuse_mount.arm({"mode": "none"})
    p, head = start_paused(fuse_mount.path, budget, backend)
    arm_paused(fuse_mount, {"mode": "stall", "stall_s": 300})
    p.send_signal(signal.SIGCONT)
    deadline = time.monotonic() + 30
    while not fuse_mount.hits() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert fuse_mount.hits(), "no read stalled"
    time.sleep(0.5)
    p.send_signal(signal.SIGINT)
    t0 = time.monotonic()
    err = read_until(p, p.stderr, b"pi2: interrupted", 10)
    waited = time.monotonic() - t0
    stalled = p.poll() is None                  # the stalled read still holds the process
    fuse_mount.arm({"mode": "none"})            # the device answers at last
    code, rest, more = finish(p, timeout=30)
    err = err.decode(errors="replace") + more
    assert b"pi2: interrupted" in err.encode() and waited < 5, (waited, err)
    assert code == 130 and "Traceback" not in err, (code, err)
    got = head + rest
    assert want.startswith(got), (got, want)
    record("stall, never returns", backend, f"Ctrl-C: `pi2: interrupted` in {waited:.1f} s, exit 130 "
           f"{'when the read returned' if stalled else 'at once'}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fault", ["truncate", "replace"])
def test_file_changed_mid_run(model, clean, tmp_path, backend, fault):
    """The file truncated to half, or replaced (a new file renamed over it, as `pi2 convert` does), while the run is
    paused (SIGSTOP) after its first generated token."""
    if backend not in clean:
        pytest.skip(f"{backend} is not usable here")
    path = tmp_path / "m.pi2.gguf"
    shutil.copyfile(model[0], path)
    want = clean[backend]
    p, head = start_paused(path, model[1], backend)
    if fault == "truncate":
        os.truncate(path, path.stat().st_size // 2)
    else:
        other = tmp_path / "other.gguf"
        other.write_bytes(os.urandom(path.stat().st_size))
        os.replace(other, path)
    p.send_signal(signal.SIGCONT)
    code, rest, err = finish(p)
    got = head + rest
    assert want.startswith(got), (got, want)                 # never a token the clean run does not emit
    if fault == "replace":                                    # the run keeps the file it opened
        assert code == 0 and got == want, err
        record(fault, backend, "same tokens (the opened file is kept)")
        return
    assert code == 1, (code, err)
    line = error_line(err)
    assert str(path) in line and "truncated" in line or "No data available" in line, line
    record(fault, backend, f"exit 1 after {len(got)}/{len(want)} bytes: " +
           ("truncated, ENODATA" if "truncated" in line else "No data available"))
