"""test_termux_scripts.py — scripts/termux-*.sh on Linux: shellcheck-clean; termux-run passes the model and
options through, with --memory-budget (3/4 of MemAvailable) only when `pi2 run --help` lists it;
termux-bench writes one report with every section; termux-setup refuses to run outside Termux; the README's
Termux section gives the scripts' own commands. `pi2` is a shim on PATH (this checkout, or a recorder)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures import write_model

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"


def shim(d: Path, body: str) -> dict:
    d.mkdir(parents=True, exist_ok=True)
    (d / "pi2").write_text("#!/bin/sh\n" + body)
    (d / "pi2").chmod(0o755)
    return {**os.environ, "PATH": f"{d}:{os.environ['PATH']}"}


def real_pi2(d: Path) -> dict:
    return shim(d, f'PYTHONPATH="{ROOT}" exec "{sys.executable}" -m pi2 "$@"\n')


def recorder(d: Path, help_text: str) -> dict:
    """A pi2 that prints help_text for `run --help` and otherwise records its arguments, one per line."""
    return shim(d, f'if [ "$2" = "--help" ]; then echo "{help_text}"; exit 0; fi\n'
                   f'printf "%s\\n" "$@" > "{d}/args"\n')


def sh(script: str, *args, env=None, cwd=None):
    return subprocess.run(["sh", str(SCRIPTS / script), *map(str, args)], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=120)


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not installed")
def test_shellcheck_clean():
    p = subprocess.run(["shellcheck", *sorted(map(str, SCRIPTS.glob("*.sh")))], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout


def test_run_without_memory_budget_flag(tmp_path):
    env = recorder(tmp_path / "bin", "Usage: pi2 run [OPTIONS] --threads")
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    p = sh("termux-run.sh", model, "-p", "two words", "-n", "4", env=env)
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "bin/args").read_text().splitlines() == ["run", str(model), "-p", "two words", "-n", "4"]
    assert "no --memory-budget yet" in p.stderr


def test_run_with_memory_budget_flag(tmp_path):
    env = recorder(tmp_path / "bin", "  --memory-budget TEXT  bytes the process may use")
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    p = sh("termux-run.sh", model, "-p", "x", env=env)
    assert p.returncode == 0, p.stderr
    args = (tmp_path / "bin/args").read_text().splitlines()
    assert args[:3] == ["run", str(model), "--memory-budget"] and args[4:] == ["-p", "x"]
    avail = int(re.search(r"^MemAvailable:\s+(\d+) kB", Path("/proc/meminfo").read_text(), re.M).group(1))
    got = int(re.fullmatch(r"(\d+)M", args[3]).group(1))
    assert abs(got - avail * 3 / 4 / 1024) <= 0.05 * avail / 1024


def test_run_usage_errors(tmp_path):
    env = recorder(tmp_path / "bin", "")
    assert sh("termux-run.sh", env=env).returncode == 2
    p = sh("termux-run.sh", tmp_path / "missing.gguf", env=env)
    assert p.returncode == 1 and "cannot read" in p.stderr and not (tmp_path / "bin/args").exists()


def test_bench_report(tmp_path):
    model = write_model(tmp_path / "m.gguf", n_layer=1)
    env = real_pi2(tmp_path / "bin")
    env["PI2_NNAPI_LIB"] = str(tmp_path / "none/libneuralnetworks.so")
    p = sh("termux-bench.sh", model, tmp_path / "report.md", env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    rep = (tmp_path / "report.md").read_text()
    for title in ("## system", "## pi2 devices", "## pi2 plan", "## pi2 bench"):
        assert title in rep, title
    assert "nnapi:     not available" in rep and "## pi2 bench, NNAPI off" not in rep
    assert re.search(r"\| +pp128 \|", rep) and re.search(r"\| +tg32 \|", rep)
    assert "(exit status" not in rep


@pytest.mark.skipif(shutil.which("pkg") is not None, reason="this machine has Termux's pkg")
def test_setup_refuses_outside_termux():
    p = sh("termux-setup.sh")
    assert p.returncode == 1 and "for Termux" in p.stderr


def test_readme_gives_the_scripts_steps():
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## On Android (Termux)"):]
    section = section[:section.index("\n## ", 5)]
    setup = (SCRIPTS / "termux-setup.sh").read_text()
    pkg_line = re.search(r"^pkg install .*$", setup, re.M).group(0)
    assert f"`{pkg_line}`" in section
    assert "python3 -m pip install ." in setup and "`python3 -m pip install .`" in section
    for script in ("termux-setup.sh", "termux-run.sh", "termux-bench.sh"):
        assert f"sh scripts/{script}" in section, script
    assert "termux-setup-storage" in section and "termux-setup-storage" in setup
