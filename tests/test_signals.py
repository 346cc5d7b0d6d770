"""test_signals.py — Ctrl-C (SIGINT) and SIGTERM wherever pi2 works long: run (tests/test_cli.py has SIGINT), perplexity,
bench and convert end with status 130 (143 for SIGTERM), `pi2: interrupted` (or `terminated`) as the last line, no
traceback; convert leaves neither output nor temporary file and its input as it was."""
import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fixtures import write_model

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def d(tmp_path_factory):
    d = tmp_path_factory.mktemp("signals")
    write_model(d / "m.gguf", n_embd=256, n_ff=1024, n_layer=4, n_ctx=2048, seed=9)
    (d / "text.txt").write_text(" ".join(f"word{i % 97} and more{i % 13}." for i in range(20000)))
    return d


def start(args, cwd):
    return subprocess.Popen([sys.executable, "-m", "pi2", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=cwd, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def busy(p, ready, timeout=120):
    """Wait until ready() says the command is in its long work (and still running)."""
    deadline = time.monotonic() + timeout
    while not ready() and time.monotonic() < deadline:
        assert p.poll() is None, p.communicate()[1].decode()
        time.sleep(0.05)
    time.sleep(0.3)
    assert p.poll() is None, "finished before the signal"


def stop(p, sig):
    p.send_signal(sig)
    out, err = p.communicate(timeout=60)
    err = err.decode(errors="replace")
    want = 130 if sig == signal.SIGINT else 128 + sig
    assert p.returncode == want, (p.returncode, err)
    assert "Traceback" not in err, err
    last = "pi2: interrupted" if sig == signal.SIGINT else f"pi2: terminated (signal {int(sig)})"
    assert err.rstrip().endswith(last), err
    return out, err


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_perplexity(d, sig):
    p = start(["perplexity", "-m", d / "m.gguf", "-f", d / "text.txt", "-c", "512", "-t", "1"], d)
    busy(p, lambda: True)
    time.sleep(1.5)
    stop(p, sig)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_bench(d, sig):
    # enough repetitions to outlast the signal by far: a bench that ends as the signal lands dies of it during the
    # interpreter's shutdown (its handlers are gone by then), which is not what this test is about
    p = start(["bench", "-m", d / "m.gguf", "-p", "512", "-n", "128", "-r", "1000", "-t", "1"], d)
    busy(p, lambda: True)
    time.sleep(1.5)
    stop(p, sig)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_convert(d, sig):
    src = d / "m.gguf"
    before = hashlib.sha256(src.read_bytes()).hexdigest()
    out = d / f"out-{int(sig)}.pi2.gguf"
    p = start(["convert", src, "-o", out, "--calib-tokens", "100000", "-t", "1"], d)
    busy(p, lambda: True)
    time.sleep(2.0)
    stop(p, sig)
    assert not out.exists()
    assert not [q.name for q in d.iterdir() if q.name.startswith(f".{out.name}.")], list(d.iterdir())
    assert hashlib.sha256(src.read_bytes()).hexdigest() == before


def test_run_sigterm(d):
    p = start(["run", d / "m.gguf", "-p", "Once upon a time", "-n", "-1", "--ignore-eos", "-c", "2048"], d)
    head = os.read(p.stdout.fileno(), 64)
    assert head and p.poll() is None
    out, err = stop(p, signal.SIGTERM)
    assert "total time" in err           # the timings so far, as for Ctrl-C
