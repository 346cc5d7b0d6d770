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
    src = write_model(d / "src.gguf", wtype="Q8_0", n_embd=256, n_ff=8192, n_layer=3, seed=11)
    pi2 = convert_pi2(src, d / "m.pi2.gguf", down_type="Q8_0", default_keep=0.5)
    # the minimum as a run's own process names it (the test process's RSS would leave every neuron hot), and a
    # little over; the FFN (13 MiB of bundles) is large enough that most of it still streams.
    probe = subprocess.run([sys.executable, "-m", "pi2", "run", str(pi2), *ARGS, "--memory-budget", "1M",
                            "--io", "pread"], capture_output=True, text=True, cwd=ROOT)
    floor = re.search(r"give at least (\d+)M", probe.stderr)
    assert probe.returncode == 2 and floor, probe.stderr
    return pi2, f"{int(floor.group(1)) + 2}M"


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
    out, runs = {}, {b: pi2_run(path, budget, b, n=N_TOKENS) for b in BACKENDS}
    for b in BACKENDS:
        code, o, err = finish(runs[b])
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

    def arm(self, rule: dict) -> None:
        Path(str(self.ctl) + ".log").write_text("")
        tmp = self.ctl.with_suffix(".tmp")
        tmp.write_text(json.dumps(rule))
        os.replace(tmp, self.ctl)          # a new inode: faultfs counts from zero

    def hits(self) -> dict:
        """The faulty requests since the last arm, by process: {pid: count}."""
        out: dict = {}
        for ln in Path(str(self.ctl) + ".log").read_text().splitlines():
            *_, mode, pid = ln.split()
            if mode != "ok":
                out[int(pid)] = out.get(int(pid), 0) + 1
        return out

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


HEAD = len(b"Once upon a time") + 1     # the prompt and the first generated token
_OUTCOMES: dict = {}


def paused_runs(paths: dict, budget: str) -> dict:
    """One run of N_TOKENS per backend (paths: backend -> model file), all at once, each paused (SIGSTOP) as soon
    as its first generated token is out: {backend: (process, bytes so far)}."""
    runs = {b: (pi2_run(path, budget, b, n=N_TOKENS), bytearray()) for b, path in paths.items()}
    waiting, deadline = dict(runs), time.monotonic() + 120
    try:
        while waiting and time.monotonic() < deadline:
            fds = {p.stdout.fileno(): b for b, (p, _) in waiting.items()}
            for fd in select.select(list(fds), [], [], 0.5)[0]:
                p, head = waiting[fds[fd]]
                chunk = os.read(fd, HEAD - len(head))
                assert chunk, p.communicate()[1].decode()
                head += chunk
                if len(head) == HEAD:
                    p.send_signal(signal.SIGSTOP)
                    del waiting[fds[fd]]
        assert not waiting, f"no first token from {sorted(waiting)}"
        for b, (p, _) in runs.items():
            assert p.poll() is None, f"{b}: finished before the fault"
    except BaseException:
        for p, _ in runs.values():              # none left behind stopped
            p.kill()
            p.communicate()
        raise
    return {b: (p, bytes(head)) for b, (p, head) in runs.items()}


def arm_paused(mount, rule, paths) -> None:
    """Arm a fault for paused runs: from now on every read of the files meets it (stat: the kernel drops its
    cached pages of each file, so a mapping reads through the file system too, as after an eviction)."""
    mount.arm(rule)
    for path in paths:
        os.stat(path)


def finish_all(runs: dict, timeout=120) -> dict:
    """SIGCONT every paused run, then {backend: (status, all its stdout, stderr, seconds until it ended)}."""
    t0 = time.monotonic()
    for p, _ in runs.values():
        p.send_signal(signal.SIGCONT)
    out = {}
    for b, (p, head) in runs.items():
        code, rest, err = finish(p, timeout)
        out[b] = (code, head + rest, err, time.monotonic() - t0)
    return out


def own_copies(mount, model, clean) -> dict:
    """{backend: its own copy of the model under the mount}: runs of one file would wait on each other's read of
    a shared page, so a fault would reach only the run that asked first."""
    paths = {}
    for b in clean:
        if not model[0].with_name(f"{b}.pi2.gguf").exists():
            shutil.copyfile(model[0], model[0].with_name(f"{b}.pi2.gguf"))
        paths[b] = mount.mnt / f"{b}.pi2.gguf"
    return paths


def read_fault_outcomes(mount, model, clean, fault) -> dict:
    """{backend: (status, stdout, stderr, seconds, faulty reads)} of one run per usable backend meeting `fault`
    from its first token on, the runs all at once (once per fault: the tests read it backend by backend)."""
    if fault not in _OUTCOMES:
        mount.arm({"mode": "none"})
        paths = own_copies(mount, model, clean)
        runs = paused_runs(paths, model[1])
        arm_paused(mount, {"mode": fault, "count": 2 if fault == "stall" else 1 << 30, "stall_s": 1.5},
                   paths.values())
        out = finish_all(runs)
        hits = mount.hits()
        _OUTCOMES[fault] = {b: (*out[b], hits.get(runs[b][0].pid, 0)) for b in out}
    return _OUTCOMES[fault]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fault", ["eio", "short", "stall"])
def test_read_fault_mid_run(fuse_mount, model, clean, backend, fault):
    if backend not in clean:
        pytest.skip(f"{backend} is not usable here")
    want = clean[backend]
    code, got, err, seconds, hits = read_fault_outcomes(fuse_mount, model, clean, fault)[backend]
    assert hits, f"the fault never fired: {err}"
    assert want.startswith(got), (got, want)                 # never a token the clean run does not emit
    if fault == "stall":                                      # through FUSE, slowed, unharmed
        assert code == 0 and got == want and seconds >= 1.5, err
        record(fault, backend, f"same {len(want)} bytes ({hits} reads stalled 1.5 s)")
        return
    assert code == 1, (code, err)
    line = error_line(err)
    assert str(fuse_mount.mnt / f"{backend}.pi2.gguf") in line, line
    errno_text = re.search(r"(Input/output error|No data available|short read)", line)
    assert errno_text and line.count(errno_text.group(1)) == 1, line     # the errno said once
    assert not line.startswith("pi2: error: EngineError"), line
    record(fault, backend, f"exit 1 after {len(got)}/{len(want)} bytes: {errno_text.group(1)}")


def never_returns_outcomes(mount, model, clean) -> dict:
    """Every usable backend's run (each on its own copy of the model) meets reads that do not return from its first
    token on; each run gets SIGINT once a stalled read has reached it; the reads are let go once every run said
    `pi2: interrupted` (or 10 s). {backend: (a stalled read reached it, seconds from SIGINT to the message or None,
    still held by its read then, status, stdout, stderr)}"""
    if "never" not in _OUTCOMES:
        mount.arm({"mode": "none"})
        paths = own_copies(mount, model, clean)
        runs = paused_runs(paths, model[1])
        arm_paused(mount, {"mode": "stall", "stall_s": 300}, paths.values())
        for p, _ in runs.values():
            p.send_signal(signal.SIGCONT)
        pids = {p.pid for p, _ in runs.values()}
        deadline = time.monotonic() + 30
        while not pids <= set(mount.hits()) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)                        # each run is waiting on its stalled read by now
        met = set(mount.hits())
        sent = time.monotonic()
        for p, _ in runs.values():
            p.send_signal(signal.SIGINT)
        said, errs = {}, {b: b"" for b in runs}
        while len(said) < len(runs) and time.monotonic() - sent < 10:
            fds = {runs[b][0].stderr.fileno(): b for b in runs if b not in said}
            for fd in select.select(list(fds), [], [], 0.05)[0]:
                b = fds[fd]
                errs[b] += os.read(fd, 4096)
                if b"pi2: interrupted" in errs[b]:
                    said[b] = time.monotonic() - sent
        held = {b: p.poll() is None for b, (p, _) in runs.items()}
        mount.arm({"mode": "none"})            # the device answers at last
        out = finish_all(runs, timeout=30)
        _OUTCOMES["never"] = {b: (runs[b][0].pid in met, said.get(b), held[b], out[b][0], out[b][1],
                                  errs[b].decode(errors="replace") + out[b][2]) for b in runs}
    return _OUTCOMES["never"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_read_never_returns(fuse_mount, model, clean, backend):
    """A read that does not return (a stalled device): Ctrl-C still ends the run within seconds with
    `pi2: interrupted`; the process exits 130 as soon as the kernel gives the read back (a read call cannot be
    cancelled; a mapping's page fault waiting on a read ahead can be, so an mmap run may end at once)."""
    if backend not in clean:
        pytest.skip(f"{backend} is not usable here")
    met, waited, held, code, got, err = never_returns_outcomes(fuse_mount, model, clean)[backend]
    assert met, "the stalled read never reached the run"
    if backend != "mmap":
        assert held, "the run was not waiting on the stalled read"      # else it would have ended at once
    assert waited is not None and waited < 5, (waited, err)
    assert code == 130 and "Traceback" not in err, (code, err)
    assert clean[backend].startswith(got), (got, clean[backend])
    record("stall, never returns", backend, f"Ctrl-C: `pi2: interrupted` in {waited:.1f} s; exit 130 "
           + ("once the read returned" if held else "at once (the fault was cancellable)"))


def file_changed_outcomes(model, clean, root: Path, fault) -> dict:
    """One run per usable backend, each on its own copy of the model, all at once, paused after the first token;
    then every copy truncated to half or replaced (a new file renamed over it, as `pi2 convert` does).
    {backend: (status, stdout, stderr, seconds, the copy's path)}"""
    if fault not in _OUTCOMES:
        paths = {}
        for b in clean:
            (root / b).mkdir()
            paths[b] = root / b / "m.pi2.gguf"
            shutil.copyfile(model[0], paths[b])
        runs = paused_runs(paths, model[1])
        for path in paths.values():
            if fault == "truncate":
                os.truncate(path, path.stat().st_size // 2)
            else:
                other = path.with_name("other.gguf")
                other.write_bytes(os.urandom(path.stat().st_size))
                os.replace(other, path)
        out = finish_all(runs)
        _OUTCOMES[fault] = {b: (*out[b], paths[b]) for b in out}
    return _OUTCOMES[fault]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fault", ["truncate", "replace"])
def test_file_changed_mid_run(model, clean, tmp_path_factory, backend, fault):
    """The file truncated to half, or replaced, while the run is paused (SIGSTOP) after its first generated token."""
    if backend not in clean:
        pytest.skip(f"{backend} is not usable here")
    want = clean[backend]
    code, got, err, _, path = file_changed_outcomes(model, clean, tmp_path_factory.mktemp(fault), fault)[backend]
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
