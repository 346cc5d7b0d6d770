"""test_devices.py — `pi2 devices`: CPU features from /proc/cpuinfo text, memory and cgroup limits from
files laid out like /proc and /sys/fs/cgroup, the O_DIRECT decision, the I/O probe's verdicts, NNAPI
present (the stand-in library) and absent, text and JSON output, and a missing model file as a one-line
error."""
from __future__ import annotations

import json
import os

import pytest

from clirun import assert_error, cli
from pi2.plan import devices as dv
from standin import build_standin

X86 = "processor\t: 0\nmodel name\t: Test CPU\nflags\t\t: fpu sse2 avx avx2 fma f16c avx512f avx512_vnni\n"
ARM = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes asimddp i8mm\nCPU part\t: 0xd44\n"


def test_cpu_features_from_cpuinfo():
    x = dv.cpu_info(X86)
    assert x["model"] == "Test CPU" and x["features"] == ["avx2", "avx512", "avx512vnni", "f16c", "fma"]
    assert dv.cpu_info(ARM)["features"] == ["dotprod", "i8mm", "neon"]
    assert dv.cpu_info("")["features"] == []
    real = dv.cpu_info()
    assert real["cores"] >= real["usable_cores"] >= 1 and real["kernels"]


def test_memory_and_cgroup_limits(tmp_path):
    mem = dv.memory_info("MemTotal:       2048000 kB\nMemFree: 1 kB\nMemAvailable:   1024000 kB\n")
    assert mem["total"] == 2048000 * 1024 and mem["available"] == 1024000 * 1024
    v1 = tmp_path / "v1"
    (v1 / "memory/grp").mkdir(parents=True)
    (v1 / "memory/grp/memory.limit_in_bytes").write_text("1073741824\n")
    assert dv.cgroup_limit("4:memory:/grp\n0::/\n", str(v1)) == 1 << 30
    (v1 / "memory/grp/memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert dv.cgroup_limit("4:memory:/grp\n", str(v1)) is None
    v2 = tmp_path / "v2"
    (v2 / "a/b").mkdir(parents=True)
    (v2 / "cgroup.controllers").write_text("cpu memory\n")
    (v2 / "a/b/memory.max").write_text("536870912\n")
    assert dv.cgroup_limit("0::/a/b\n", str(v2)) == 1 << 29
    (v2 / "a/b/memory.max").write_text("max\n")
    assert dv.cgroup_limit("0::/a/b\n", str(v2)) is None


def test_o_direct_probe(tmp_path):
    f = tmp_path / "m.bin"
    f.write_bytes(os.urandom(5000))
    r = dv.o_direct(f)
    try:   # the same question asked independently: does this file system accept O_DIRECT at all?
        os.close(os.open(f, os.O_RDONLY | os.O_DIRECT))
        accepts = True
    except OSError:
        accepts = False
    assert r["supported"] == accepts
    assert r["detail"] == ("O_DIRECT" if accepts else "buffered: the file system refuses O_DIRECT (EINVAL at open)")


def test_cli_devices_without_nnapi(tmp_path):
    res = cli("devices", "--json", "--nnapi-lib", str(tmp_path / "libneuralnetworks.so"))
    assert res.code == 0, res.err
    rep = json.loads(res.out)
    assert rep["nnapi"]["available"] is False and "NNAPI unavailable" in rep["nnapi"]["reason"]
    io = rep["io"]
    assert [b["name"] for b in io["backends"]] == ["uring", "aio", "pread", "mmap"]
    assert io["probed_on"].startswith("a temporary file in ") and io["chosen"] in ("uring", "aio", "pread", "mmap")
    assert all(b["status"] in ("ok", "serial", "refused", "unavailable", "failed") and b["reason"] for b in io["backends"])
    assert next(b for b in io["backends"] if b["name"] == "pread")["status"] in ("ok", "serial")
    assert "o_direct" not in rep and rep["memory"]["total"] > 0
    text = cli("devices", "--nnapi-lib", str(tmp_path / "libneuralnetworks.so")).out
    assert "\nnnapi:     not available (" in text and text.startswith("cpu:")


def test_cli_devices_with_nnapi_and_model(tmp_path):
    lib = build_standin(tmp_path / "nn")
    model = tmp_path / "m.gguf"
    model.write_bytes(b"\0" * 8192)
    rep = json.loads(cli("devices", "-m", model, "--json", "--nnapi-lib", lib).out)
    assert rep["nnapi"] == {"available": True, "runtime_feature_level": 31, "devices": [
        {"name": "standin-npu", "type": "accelerator", "feature_level": 31},
        {"name": "nnapi-reference", "type": "cpu", "feature_level": 31}]}
    assert rep["o_direct"]["path"] == str(model) and rep["io"]["probed_on"] == str(model)
    text = cli("devices", model, "--nnapi-lib", lib).out
    assert "  standin-npu: accelerator, feature level 31" in text and "\no_direct:  " in text
    assert "; --io auto picks " in text and "\n  pread: " in text


def test_cli_devices_missing_model(tmp_path):
    assert_error(cli("devices", "-m", tmp_path / "none.gguf"), code=1, match="cannot open")
