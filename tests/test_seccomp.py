"""test_seccomp.py — pi2 run inside a seccomp filter like Android's app sandbox (tests/c/seccomp_exec.c, inherited
by every child): io_uring_setup trapped (SIGSYS) or killing the process, Linux AIO refused with EPERM. The probe's
children meet the filter, the parent survives, `--io auto` falls back to a backend that works and the tokens are the
unfiltered run's; asking for the refused backend is a clean error."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures import write_model
from pi2file import convert_pi2

ROOT = Path(__file__).resolve().parents[1]
FILTERS = {"trap-uring": ["--trap-uring"], "kill-uring": ["--kill-uring"], "deny-aio": ["--deny-aio"],
           "android": ["--trap-uring", "--deny-aio"]}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        pytest.skip("no C compiler")
    d = tmp_path_factory.mktemp("seccomp")
    exe = d / "seccomp_exec"
    subprocess.run([cc, "-O1", "-Wall", "-Werror", "-o", str(exe), str(ROOT / "tests/c/seccomp_exec.c")], check=True)
    src = write_model(d / "src.gguf", wtype="Q8_0", n_ff=256, n_layer=2, seed=3)
    path = convert_pi2(src, d / "m.pi2.gguf", down_type="Q8_0", default_keep=0.5)
    from pi2.engine import CModel
    from pi2.model.loader import load_model
    from pi2.plan.budget import make_plan
    m = load_model(path)
    floor = make_plan(m, CModel.from_model(m), 1 << 40, 64, 1, io="pread").floor
    m.close()
    return exe, path, f"{(floor >> 20) + 1}M"


def pi2(setup, flt, *args):
    exe, _, _ = setup
    cmd = ([str(exe), *FILTERS[flt], "--"] if flt else []) + [sys.executable, "-m", "pi2", *map(str, args)]
    p = subprocess.run(cmd, capture_output=True, cwd=ROOT, timeout=120)
    return p.returncode, p.stdout, p.stderr.decode(errors="replace")


def run_args(setup, io):
    _, path, budget = setup
    return ["run", path, "-p", "Once upon a time", "-n", "8", "--temp", "0", "-c", "64", "-t", "1",
            "--memory-budget", budget, "--io", io, "--verbose"]


@pytest.mark.parametrize("flt", sorted(FILTERS))
def test_probe_and_run_under_the_filter(setup, flt):
    code, want, err = pi2(setup, None, *run_args(setup, "pread"))
    assert code == 0, err
    code, out, err = pi2(setup, flt, "devices", "-m", setup[1], "--json")
    assert code == 0, err
    verdicts = {b["name"]: b for b in json.loads(out)["io"]["backends"]}
    if "uring" in flt or flt == "android":
        assert verdicts["uring"]["status"] == "refused", verdicts["uring"]
        assert ("SIGSYS" in verdicts["uring"]["reason"] or "Bad system call" in verdicts["uring"]["reason"] or
                "Killed" in verdicts["uring"]["reason"] or "seccomp" in verdicts["uring"]["reason"]), verdicts["uring"]
    if flt in ("deny-aio", "android"):
        assert verdicts["aio"]["status"] == "unavailable" and "not permitted" in verdicts["aio"]["reason"], verdicts
    assert verdicts["pread"]["status"] in ("ok", "serial")
    code, out, err = pi2(setup, flt, *run_args(setup, "auto"))       # the parent survives and falls back
    assert code == 0 and out == want, err
    if "uring" in flt or flt == "android":
        code, out, err = pi2(setup, flt, *run_args(setup, "uring"))
        assert code == 2 and out == b"" and "--io uring is not usable here" in err and "Traceback" not in err, err
    if flt in ("deny-aio", "android"):
        code, out, err = pi2(setup, flt, *run_args(setup, "aio"))
        assert code == 1 and out == b"" and "Traceback" not in err, err
        assert "io_setup: Operation not permitted" in err, err
