"""run.py — the GGUF fuzzer's driver: mutated seeds through `info`, `tokenize`, `run -n 1`, a budgeted run and
`convert`, each execution classified, in worker processes that a crash, a sanitizer report or a hang cannot take
down with the driver.

    python -m tests.fuzz.run --execs 100000 --jobs 2 --seed 1 --out fuzz-out [--no-real]

Execution i of a run is a pure function of (seed, i): a finding is replayed with `--replay I`. Outcomes:
ok (exit 0), error (exit 1/2 with the one-line contract), and the findings: traceback (an unanticipated exception
or more than the error line), exit (another status), hang, crash (the worker died: signal or sanitizer), dirty
(convert failed but left output, a temporary file, or changed its input). Findings are written to OUT/findings/
as the mutated file plus a .txt with the command, description and output. Exit status 1 when any finding.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from tests.fuzz import corpus
from tests.fuzz.gguf_map import walk
from tests.fuzz.mutate import mutate

COMMANDS = ("info", "tokenize", "run", "run-reference", "budget", "convert")
WEIGHTS = {"gguf": (3, 3, 4, 1, 1, 1), "pi2": (2, 1, 3, 1, 4, 0), "real": (3, 3, 2, 0, 0, 0)}
FINDINGS = ("traceback", "exit", "hang", "crash", "dirty")
EXEC_TIMEOUT = 15           # seconds, inside the worker (SIGALRM); the driver kills a worker silent for 3x that
RESTART_EVERY = 2000        # a fresh worker process now and then: what one execution leaks cannot pile up
ERROR_RE = re.compile(r"^pi2: error: \S")
UNEXPECTED_RE = re.compile(r"^pi2: error: [A-Za-z_.]*(Error|Exception|Interrupt|Exit|Abort)\b: ")
SANITIZER_RE = re.compile(r"(AddressSanitizer|UndefinedBehaviorSanitizer|LeakSanitizer|runtime error:)")


def plan_exec(seeds: list, blobs: dict, seed: int, i: int) -> tuple:
    """(seed entry, command, mutated bytes, description) of execution i."""
    rng = np.random.default_rng([seed, i])
    p = np.array([0.04 if x["kind"] == "real" else 1.0 for x in seeds])    # a real model costs ~50x a tiny one
    s = seeds[int(rng.choice(len(seeds), p=p / p.sum()))]
    w = np.array(WEIGHTS[s["kind"]], float)
    cmd = COMMANDS[int(rng.choice(len(COMMANDS), p=w / w.sum()))]
    blob, lay = blobs[s["path"]]
    data, desc = mutate(blob, rng, lay)
    return s, cmd, data, desc


def load_blobs(seeds: list) -> dict:
    """The bytes each mutation starts from: whole synthetic files; a real model's header only."""
    out = {}
    for s in seeds:
        b = Path(s["path"]).read_bytes() if s["kind"] != "real" else _head(s["path"])
        out[s["path"]] = (b, walk(b))
    return out


def _head(path: str) -> bytes:
    with open(path, "rb") as f:
        b = f.read(8 << 20)
    return b[:walk(b).data_start]


def write_input(s: dict, data: bytes, dst: Path) -> None:
    with open(dst, "wb") as f:
        f.write(data)
        if s["kind"] == "real":     # the real tensor data after the mutated header
            with open(s["path"], "rb") as src:
                start = walk(_head(s["path"])).data_start
                n = os.fstat(src.fileno()).st_size - start
                while n > 0:
                    k = os.sendfile(f.fileno(), src.fileno(), start, n)
                    if k <= 0:
                        break
                    start, n = start + k, n - k


def argv_for(cmd: str, path: Path, work: Path, budget: str) -> list:
    if cmd == "info":
        return ["info", path]
    if cmd == "tokenize":
        return ["tokenize", "-m", path, "-p", "Hello world<|im_end|> ünï 123"]
    if cmd in ("run", "run-reference"):
        extra = ["--engine", "reference"] if cmd == "run-reference" else []
        return ["run", path, "-p", "Hi there", "-n", "1", "--temp", "0", "-c", "64", "-t", "1", *extra]
    if cmd == "budget":
        return ["run", path, "-p", "Hi there", "-n", "2", "--temp", "0", "-c", "64", "-t", "1",
                "--memory-budget", budget, "--io", "pread"]
    return ["convert", path, "-o", work / "out.pi2.gguf", "--calib-tokens", "24", "-t", "1"]


def classify(res, cmd: str, work: Path, before: str, path: Path) -> str:
    lines = [ln for ln in res.err.splitlines() if ln.strip()]
    if "did not finish within" in res.err:
        return "hang"
    if SANITIZER_RE.search(res.err) or "Traceback" in res.err:
        return "traceback" if "Traceback" in res.err else "crash"
    if res.code == 0:
        outcome = "ok"
    elif res.code in (1, 2):
        errs = [k for k, ln in enumerate(lines) if ln.startswith("pi2: error:")]
        if len(errs) != 1 or UNEXPECTED_RE.match(lines[errs[0]]) or not ERROR_RE.match(lines[errs[0]]):
            return "traceback"
        if any(not ln.startswith("  hint: ") for ln in lines[errs[0] + 1:]):
            return "traceback"
        outcome = "error"
    else:
        return "exit"
    if cmd == "convert":
        left = [p.name for p in work.iterdir() if p.name.startswith(".out.pi2.gguf") or
                (p.name == "out.pi2.gguf" and outcome != "ok")]
        if left or hashlib.sha256(path.read_bytes()).hexdigest() != before:
            return "dirty"
    return outcome


def worker(args) -> None:
    """Run executions [start, end) and report each as one JSON line on stdout (the CLI's own output is captured)."""
    sys.path.insert(0, str(corpus.TESTS))
    from clirun import cli
    seeds = corpus.build(Path(args.corpus), real=not args.no_real)
    blobs = load_blobs(seeds)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    report = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    for i in range(args.start, args.end):
        s, cmd, data, desc = plan_exec(seeds, blobs, args.seed, i)
        report.write(json.dumps({"start": i}) + "\n")
        path = work / "in.gguf"
        write_input(s, data, path)
        for p in work.iterdir():
            if p.name != "in.gguf":
                p.unlink()
        before = hashlib.sha256(data).hexdigest() if cmd == "convert" else ""
        t0 = time.monotonic()
        res = cli(*argv_for(cmd, path, work, s["budget"]), timeout=EXEC_TIMEOUT)
        outcome = classify(res, cmd, work, before, path)
        rec = {"i": i, "cmd": cmd, "outcome": outcome, "ms": round(1000 * (time.monotonic() - t0))}
        if outcome in FINDINGS:
            rec.update(desc=desc, seed=s["path"], code=res.code, err=res.err[-4000:])
        report.write(json.dumps(rec) + "\n")


def drive(args) -> int:
    out = Path(args.out)
    (out / "findings").mkdir(parents=True, exist_ok=True)
    corpus_dir = out / "corpus"
    seeds = corpus.build(corpus_dir, real=not args.no_real)   # once, before the workers start
    counts = {k: 0 for k in ("ok", "error", *FINDINGS)}
    per_cmd: dict = {}
    chunks = [(a, min(a + RESTART_EVERY, args.execs)) for a in range(0, args.execs, RESTART_EVERY)]
    running: dict = {}
    t0 = time.monotonic()
    log = open(out / "log.jsonl", "a")
    shown = 0
    while chunks or running:
        while chunks and len(running) < args.jobs:
            a, b = chunks.pop(0)
            running[_spawn(args, corpus_dir, out, len(running) + a, a, b)] = {"range": (a, b), "cur": None,
                                                                            "seen": time.monotonic(), "buf": b""}
        procs = list(running)
        ready, _, _ = select.select([p.stdout for p in procs], [], [], 1.0)
        for p in procs:
            st = running[p]
            if p.stdout in ready:
                chunk = os.read(p.stdout.fileno(), 65536)
                st["buf"] += chunk
                st["seen"] = time.monotonic()
                *done, st["buf"] = st["buf"].split(b"\n")
                for line in done:
                    rec = json.loads(line)
                    if "start" in rec:
                        st["cur"] = rec["start"]
                        continue
                    st["cur"] = None
                    _count(rec, counts, per_cmd, log, out, args, seeds)
                if chunk:
                    continue
            elif time.monotonic() - st["seen"] < 3 * EXEC_TIMEOUT:
                continue
            else:
                p.kill()
            p.wait()
            shutil.rmtree(p.work, ignore_errors=True)
            del running[p]
            err = Path(p.stderr_path).read_text(errors="replace")
            if st["cur"] is not None:     # died (or hung) inside an execution: a finding
                kind = "hang" if p.returncode == -9 else "crash"
                rec = {"i": st["cur"], "cmd": "?", "outcome": kind, "code": p.returncode, "err": err[-4000:]}
                _count(rec, counts, per_cmd, log, out, args, seeds)
                if st["cur"] + 1 < st["range"][1]:
                    chunks.insert(0, (st["cur"] + 1, st["range"][1]))
            elif p.returncode != 0:
                print(f"fuzz: a worker failed outside any execution (status {p.returncode}):\n{err[-2000:]}",
                      file=sys.stderr)
                return 2
            elif SANITIZER_RE.search(err):
                rec = {"i": -1, "cmd": "?", "outcome": "crash", "code": 0, "err": err[-4000:]}
                _count(rec, counts, per_cmd, log, out, args, seeds)
        n = sum(counts.values())
        if n // 1000 > shown:
            shown = n // 1000
            _progress(counts, n, t0)
    _progress(counts, sum(counts.values()), t0)
    summary = {"execs": sum(counts.values()), "seed": args.seed, "seconds": round(time.monotonic() - t0, 1),
               "outcomes": counts, "per_command": per_cmd}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary))
    return 1 if any(counts[k] for k in FINDINGS) else 0


def _progress(counts: dict, n: int, t0: float) -> None:
    rate = n / max(time.monotonic() - t0, 1e-9)
    print(f"fuzz: {n} executions ({rate:.0f}/s): " + ", ".join(f"{k} {v}" for k, v in counts.items()),
          file=sys.stderr, flush=True)


def _spawn(args, corpus_dir: Path, out: Path, slot: int, a: int, b: int):
    errp = out / f"worker-{a}.stderr"
    shm = Path("/dev/shm")          # inputs on tmpfs: no disk writeback stalls a worker
    work = Path(tempfile.mkdtemp(prefix="pi2fuzz-", dir=shm if shm.is_dir() else None))
    cmd = [sys.executable, "-m", "tests.fuzz.run", "--worker", "--seed", str(args.seed), "--start", str(a),
           "--end", str(b), "--corpus", str(corpus_dir), "--work", str(work)]
    if args.no_real:
        cmd.append("--no-real")
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=open(errp, "w"), cwd=corpus.TESTS.parent)
    p.stderr_path, p.work = str(errp), work
    return p


def _count(rec: dict, counts: dict, per_cmd: dict, log, out: Path, args, seeds: list) -> None:
    counts[rec["outcome"]] += 1
    c = per_cmd.setdefault(rec["cmd"], {})
    c[rec["outcome"]] = c.get(rec["outcome"], 0) + 1
    if rec["outcome"] in FINDINGS:
        log.write(json.dumps(rec) + "\n")
        log.flush()
        s, cmd, data, desc = plan_exec(seeds, load_blobs(seeds), args.seed, rec["i"]) if rec["i"] >= 0 else \
            (None, "?", b"", "")
        stem = out / "findings" / f"{rec['outcome']}-{args.seed}-{rec['i']}"
        if data:
            stem.with_suffix(".gguf").write_bytes(data)
        stem.with_suffix(".txt").write_text(f"seed {args.seed} execution {rec['i']} command {cmd}\n{desc}\n"
                                            f"seed file {s and s['path']}\nstatus {rec.get('code')}\n{rec.get('err')}")
        print(f"fuzz: FINDING {rec['outcome']} at execution {rec['i']} ({cmd}): {desc}", file=sys.stderr, flush=True)


def replay(args) -> int:
    sys.path.insert(0, str(corpus.TESTS))
    from clirun import cli
    seeds = corpus.build(Path(args.out) / "corpus", real=not args.no_real)
    s, cmd, data, desc = plan_exec(seeds, load_blobs(seeds), args.seed, args.replay)
    work = Path(args.out) / "replay"
    work.mkdir(parents=True, exist_ok=True)
    write_input(s, data, work / "in.gguf")
    argv = argv_for(cmd, work / "in.gguf", work, s["budget"])
    print(f"execution {args.replay}: {desc}\npi2 {' '.join(map(str, argv))}", file=sys.stderr)
    res = cli(*argv, timeout=EXEC_TIMEOUT)
    print(res.err, file=sys.stderr)
    return res.code


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--execs", type=int, default=2000)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default="fuzz-out")
    ap.add_argument("--no-real", action="store_true", help="synthetic seeds only")
    ap.add_argument("--replay", type=int, default=None, help="run one execution in this process and show it")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    for a in ("--start", "--end"):
        ap.add_argument(a, type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--corpus", help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return 0
    if args.replay is not None:
        return replay(args)
    return drive(args)


if __name__ == "__main__":
    sys.exit(main())
