# test_convert.py — `pi2 convert`: the pi2 file's layout and metadata, exactness of the bundles,
# statistics, and the safe write (refused -o, failures, a killed conversion).
import errno
import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import gguf
import numpy as np
import pytest

from fixtures import write_model
from pi2.convert import ConvertError, convert, default_output, layout, profile
from pi2.errors import FileError, UsageError
from pi2.model.gguf_file import GGML_TYPES, GGUFFile
from pi2.reference.quants import dequantize

FFN = ("ffn_gate", "ffn_up", "ffn_down", "ffn_down_t", "fc2")


def sha(p):
    return hashlib.sha256(Path(p).read_bytes()).hexdigest()


def run(src, out=None, **kw):
    kw.setdefault("calib_tokens", 256)
    return convert(src, out, progress=False, **kw)


@pytest.fixture(scope="module")
def q41(tmp_path_factory):
    d = tmp_path_factory.mktemp("cv")
    src = write_model(d / "m.gguf", wtype="Q4_1", n_embd=64, n_ff=128, n_layer=2)
    rep = run(src)
    return src, Path(rep.output), rep


def check_bundles(src, out, down_bound):
    s, o = GGUFFile(src), GGUFFile(out)
    n_layer = s.kv["llama.block_count"] if "llama.block_count" in s.kv else s.kv[f"{s.kv['general.architecture']}.block_count"]
    gud = o.kv["pi2.ffn.layout"] == "bundle-gud"
    for il in range(n_layer):
        p = f"blk.{il}."
        perm = o.raw(p + "ffn_perm.weight").view(np.int32).ravel()
        n_ff = perm.size
        assert sorted(perm.tolist()) == list(range(n_ff))
        freq = o.raw(p + "ffn_freq.weight").view(np.float32).ravel()
        assert np.all(np.diff(freq) <= 0) and freq.min() >= 0 and freq.max() <= 1
        g, u = s.tensors[p + "ffn_gate.weight"], s.tensors[p + "ffn_up.weight"]
        dname = p + ("ffn_down_t.weight" if p + "ffn_down_t.weight" in s.tensors else "ffn_down.weight")
        dn = s.tensors[dname]
        n_embd = u.ne[0]
        dtype = int(o.kv["pi2.ffn.down_types"][il])
        widths = ([g.row_bytes] if gud else []) + [u.row_bytes, layout.row_bytes(dtype, n_embd)]
        b = o.tensors[p + "ffn_bundle.weight"]
        assert GGML_TYPES[b.type][0] == "I8" and b.ne[1] == n_ff and b.ne[0] % 32 == 0 and b.ne[0] >= sum(widths)
        parts = layout.unbundle(o.raw(b.name), widths)
        if gud:
            assert p + "ffn_gate.weight" not in o.tensors
            assert np.array_equal(parts[0], s.raw(g.name)[perm])
        else:
            assert np.array_equal(o.raw(p + "ffn_gate.weight"), s.raw(g.name)[perm])
        assert np.array_equal(parts[-2], s.raw(u.name)[perm])                       # up: exact bytes
        assert not o.raw(b.name)[:, sum(widths):].any()                              # zero padding
        want = (dequantize(s.raw(dname), dn.type, n_embd) if dname.endswith("_t.weight")
                else dequantize(s.raw(dname), dn.type, n_ff).T)[perm]
        if GGML_TYPES[dtype][0] == "I8":      # int8 rows: value = column scale · row scale · q
            got = (parts[-1].view(np.int8).astype(np.float32) * o.raw(p + "ffn_down_scale.weight").view(np.float32).reshape(-1, 1)
                   * o.raw(p + "ffn_down_colscale.weight").view(np.float32).ravel())
        else:
            got = dequantize(np.ascontiguousarray(parts[-1]), dtype, n_embd)
        err = np.linalg.norm(got - want) / np.linalg.norm(want)
        assert err <= down_bound, (il, err)
        for t in (p + "ffn_thresh.weight", p + "ffn_err.weight"):
            assert o.tensors[t].ne == (len(o.kv["pi2.ffn.keep_grid"]),)


def test_output_is_gguf_with_pi2_metadata(q41):
    src, out, rep = q41
    assert out == default_output(src) and out.name == "m.pi2.gguf"
    r = gguf.GGUFReader(out)
    assert r.alignment == 4096
    o = GGUFFile(out)
    assert o.alignment == 4096 and all(t.offset % 4096 == 0 for t in o.tensors.values())
    assert o.kv["pi2.version"] == 1 and o.kv["pi2.source.sha256"] == sha(src)
    assert o.kv["pi2.source.file"] == "m.gguf" and o.kv["pi2.calib.sha256"] == sha(profile.DEFAULT_CALIB)
    assert o.kv["pi2.calib.tokens"] == rep.n_tokens <= 256 and o.kv["pi2.ffn.score"] == "act"
    assert o.kv["pi2.ffn.layout"] == "bundle-ud" and list(o.kv["pi2.ffn.down_types"]) == [24, 24]   # Q4_1 -> I8
    assert np.allclose(o.kv["pi2.ffn.keep_grid"], profile.KEEP_GRID) and abs(o.kv["pi2.ffn.default_keep"] - profile.DEFAULT_KEEP) < 1e-6
    s = GGUFFile(src)
    for k, v in s.kv.items():
        if k != "general.alignment":
            assert np.array_equal(o.kv[k], v) if hasattr(v, "shape") else o.kv[k] == v, k


def test_non_ffn_tensors_byte_identical(q41):
    src, out, _ = q41
    s, o = GGUFFile(src), GGUFFile(out)
    for name, t in s.tensors.items():
        if name.split(".")[-2] in FFN:
            continue
        u = o.tensors[name]
        assert (u.type, u.ne) == (t.type, t.ne), name
        assert np.array_equal(o.raw(name), s.raw(name)), name


def test_bundles_decode_to_source(q41):
    src, out, rep = q41
    check_bundles(src, out, down_bound=0.05)
    assert max(rep.down_err) < 0.05


def test_statistics_are_sane(q41):
    _, _, rep = q41
    assert np.all(np.diff(rep.thresh, axis=1) <= 0) and rep.thresh[:, -1].max() == 0
    assert np.all(np.diff(rep.err, axis=1) <= 1e-6) and rep.err[:, -1].max() < 1e-6 and rep.err[:, 0].min() > 0.1


@pytest.mark.parametrize("ffn_type", ["f32", "f16"])
def test_lossless_down(tmp_path, ffn_type):
    src = write_model(tmp_path / "m.gguf", wtype="Q8_0" if ffn_type == "f32" else "F16", n_embd=64, n_ff=96)
    rep = run(src, tmp_path / "o.gguf", ffn_type=ffn_type)
    assert set(rep.down_types) == {ffn_type.upper()} and max(rep.down_err) == 0
    check_bundles(src, rep.output, down_bound=0.0)


@pytest.mark.parametrize("arch", ["qwen2", "gemma3"])
def test_gud_layout_other_archs(tmp_path, arch):
    src = write_model(tmp_path / "m.gguf", arch=arch, wtype="Q8_0", n_embd=64, n_ff=128)
    rep = run(src, tmp_path / "o.gguf", ffn_layout="bundle-gud")
    assert set(rep.down_types) == {"I8"}
    check_bundles(src, rep.output, down_bound=0.02)


def test_pwri_keeps_predictors(tmp_path):
    src = write_model(tmp_path / "p.gguf", pwri=True, wtype="F16", n_embd=64, n_ff=128)
    rep = run(src, tmp_path / "o.gguf")
    s, o = GGUFFile(src), GGUFFile(rep.output)
    assert rep.down_types == ["F16", "F16"] and max(rep.down_err) == 0      # rows already: copied exactly
    check_bundles(src, rep.output, down_bound=0.0)
    for il in range(2):
        perm = o.raw(f"blk.{il}.ffn_perm.weight").view(np.int32).ravel()
        assert np.array_equal(o.raw(f"blk.{il}.fc1.weight"), s.raw(f"blk.{il}.fc1.weight"))
        assert np.array_equal(o.raw(f"blk.{il}.fc2.weight"), s.raw(f"blk.{il}.fc2.weight")[perm])


def test_output_naming_the_input_is_refused(tmp_path):
    src = write_model(tmp_path / "m.gguf", n_embd=64, n_ff=64)
    h = sha(src)
    with pytest.raises(UsageError):
        run(src, src)
    os.link(src, tmp_path / "hard.gguf")
    with pytest.raises(UsageError):
        run(src, tmp_path / "hard.gguf")
    r = subprocess.run([sys.executable, "-m", "pi2", "convert", str(src), "-o", str(src)], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.startswith("pi2: error:") and "input" in r.stderr
    assert sha(src) == h


def test_failed_write_leaves_existing_output(tmp_path, monkeypatch):
    src = write_model(tmp_path / "m.gguf", n_embd=64, n_ff=64)
    out = tmp_path / "o.gguf"
    out.write_bytes(b"previous output")

    def full(self, *a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(gguf.GGUFWriter, "write_tensor_data", full)
    with pytest.raises(ConvertError, match="no space left on device"):
        run(src, out)
    assert out.read_bytes() == b"previous output"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf", "o.gguf"]


def test_full_disk_on_tmpfs(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        src = write_model(tmp_path / "m.gguf", n_embd=64, n_ff=128)
        with pytest.raises(FileError, match="MiB free"):      # refused before profiling
            run(src, mnt / "o.gguf")
        assert os.listdir(mnt) == []
    finally:
        subprocess.run(["umount", str(mnt)])


def test_unwritable_output_is_refused_before_profiling(tmp_path, monkeypatch):
    """An output directory pi2 cannot write (a read-only mount) fails at once, before any layer is profiled."""
    mnt = tmp_path / "ro"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        import pi2.convert.profile as prof
        profiled = []
        monkeypatch.setattr(prof.LayerStats, "add", lambda *a, **k: profiled.append(1))
        src = write_model(tmp_path / "m.gguf", n_embd=64, n_ff=128)
        with pytest.raises(FileError, match="cannot write to"):
            run(src, mnt / "o.gguf")
        assert profiled == []
        r = subprocess.run([sys.executable, "-m", "pi2", "convert", str(src), "-o", str(mnt / "o.gguf")],
                           capture_output=True, text=True)
        assert r.returncode == 1 and r.stderr.startswith("pi2: error: cannot write to") and "Traceback" not in r.stderr
    finally:
        subprocess.run(["umount", str(mnt)])


_DRIVER = textwrap.dedent("""
    import os, sys, time
    import pi2.convert.writer as w
    stage = sys.argv[3]
    real = os.replace
    def stall(*a, **k):
        print("ready", flush=True); time.sleep(60)
    if stage == "write":
        w.os.replace = stall
    else:
        import pi2.convert.profile as p
        add = p.LayerStats.add
        def slow(self, *a, **k):
            print("ready", flush=True); time.sleep(60)
        p.LayerStats.add = slow
    from pi2.convert import convert
    convert(sys.argv[1], sys.argv[2], calib_tokens=256, progress=False)
""")


@pytest.mark.parametrize("stage", ["profile", "write"])
def test_killed_conversion_leaves_nothing(tmp_path, stage):
    src = write_model(tmp_path / "m.gguf", n_embd=64, n_ff=128)
    out = tmp_path / "o.gguf"
    h = sha(src)
    p = subprocess.Popen([sys.executable, "-c", _DRIVER, str(src), str(out), stage], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        if stage == "write":
            assert any(n.endswith(".tmp") for n in os.listdir(tmp_path))   # the whole file, not yet renamed
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    assert not out.exists() and sha(src) == h
    run(src, out)                                   # a later conversion succeeds and removes the stale file
    assert out.exists() and sorted(os.listdir(tmp_path)) == ["m.gguf", "o.gguf"]


def test_cli_convert(tmp_path):
    src = write_model(tmp_path / "m.gguf", n_embd=64, n_ff=64)
    r = subprocess.run([sys.executable, "-m", "pi2", "convert", str(src), "--calib-tokens", "64"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "wrote" in r.stdout and (tmp_path / "m.pi2.gguf").exists()
    r = subprocess.run([sys.executable, "-m", "pi2", "convert", str(src), "--layout", "rows"], capture_output=True, text=True)
    assert r.returncode == 2 and "layout" in r.stderr


def test_thresholds_and_frequencies_from_histograms():
    rng = np.random.default_rng(1)
    a = (rng.standard_normal((300, 256)) * np.linspace(0.05, 2, 256)).astype(np.float32)
    L = profile.LayerStats(256)
    L.add(a[:150], a[:150], 1)
    L.add(a[150:], a[150:], 1)
    s = np.abs(a)
    for k in (0.05, 0.3, 0.7, 0.95):
        assert abs((s > L.threshold(k)).mean() - k) < 0.005
    t = L.threshold(0.5)
    assert np.abs(L.frequency(t) - (s > t).mean(0)).max() < 0.05


@pytest.mark.model
@pytest.mark.slow
def test_smollm2_statistics(tmp_path):
    from conftest import model_file
    src = model_file("smollm2-135m")
    t0 = time.perf_counter()
    rep = convert(src, tmp_path / "s.pi2.gguf", calib_tokens=512, progress=False)
    o = GGUFFile(rep.output)
    assert o.kv["pi2.calib.tokens"] == 512 and rep.down_types == ["I8"] * 30
    assert max(rep.down_err) < 0.05
    for il in range(30):
        f = o.raw(f"blk.{il}.ffn_freq.weight").view(np.float32).ravel()
        assert 0 <= f.min() and f.max() <= 1 and np.all(np.diff(f) <= 0)
    assert np.all(np.diff(rep.thresh, axis=1) <= 0)
    assert np.all(np.diff(rep.err, axis=1) <= 1e-3) and rep.err[:, -1].max() < 1e-6
    k = np.asarray(rep.keep_at_10pct)
    assert 0.05 <= k.min() and k.max() <= 0.9
    print(f"convert SmolLM2 (512 tokens): {time.perf_counter() - t0:.1f}s")


def test_info_shows_sparse_metadata(q41):
    _, out, _ = q41
    r = subprocess.run([sys.executable, "-m", "pi2", "info", str(out)], capture_output=True, text=True,
                       env={**os.environ, "COLUMNS": "200"})
    assert r.returncode == 0, r.stderr
    assert "bundle-ud" in r.stdout and "keep @10% err" in r.stdout and "hot80" in r.stdout


@pytest.mark.parametrize("ffn_type,src_type,row", [("q5_1", "Q4_1", "Q5_1"), ("q4_1", "Q4_1", "Q4_1"),
                                                   ("q4_1", "Q8_0", "Q8_0"), ("q5_1", "Q8_0", "Q8_0")])
def test_small_down_rows(tmp_path, ffn_type, src_type, row):
    """--ffn-type q5_1 / q4_1: the row type follows the source's bits, and the rows decode to the source."""
    src = write_model(tmp_path / "m.gguf", wtype=src_type, n_embd=64, n_ff=96)
    rep = run(src, tmp_path / "o.gguf", ffn_type=ffn_type)
    assert set(rep.down_types) == {row}
    bound = {"Q4_1": 0.12, "Q5_1": 0.06, "Q8_0": 0.01}[row]
    assert max(rep.down_err) < bound
    check_bundles(src, rep.output, down_bound=bound)


def test_q4_1_rows_by_source_bits():
    from pi2.convert.layout import down_row_type
    from pi2.model.gguf_file import TYPE_IDS
    got = {s: down_row_type(TYPE_IDS[s], 1536, "q4_1") for s in ("Q4_K", "Q6_K", "Q5_0", "Q8_0", "F16")}
    assert got == {"Q4_K": TYPE_IDS["Q4_1"], "Q6_K": TYPE_IDS["Q5_1"], "Q5_0": TYPE_IDS["Q5_1"],
                   "Q8_0": TYPE_IDS["Q8_0"], "F16": TYPE_IDS["F16"]}
