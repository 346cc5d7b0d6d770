"""test_io.py — the storage layer (csrc/io/, pi2/engine/flash_io.py, pi2/plan/profile.py): every backend returns
Python's own bytes for random aligned requests (last partial block, multi-block spans); per-request
errors (past the end, a closed descriptor, misalignment); the probe's choice and its refusal logic under a
real seccomp filter and a forced SIGSYS; the O_DIRECT fallback; the device profile's cache; the CLI."""
from __future__ import annotations

import errno
import json
import os
import random

import numpy as np
import pytest

from clirun import assert_error, cli
import cinternal as cio
from pi2.engine import flash_io as fio
from pi2.errors import EngineError, UnsupportedError, UsageError

SIZE = 37 * 4096 + 1234          # a partial last block
ALL = ("uring", "aio", "pread", "mmap")


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("io") / "weights.bin"
    p.write_bytes(np.random.default_rng(5).integers(0, 256, SIZE, dtype=np.uint8).tobytes())
    return p


@pytest.fixture(scope="module")
def probed(data_file):
    return fio.probe(data_file)


def usable_backends(probed):
    return [b for b in ALL if probed.verdict(b).usable]


def random_requests(rng, n_blocks, count):
    reqs = []
    for _ in range(count):
        start = rng.randrange(n_blocks)
        span = rng.choice([1, 1, 2, 3, 5, 8])
        reqs.append((start * 4096, span * 4096))
    reqs.append(((n_blocks - 1) * 4096, 4096))          # the last, partial block
    reqs.append(((n_blocks - 2) * 4096, 3 * 4096))      # spans into it and beyond the end
    return reqs


@pytest.mark.parametrize("backend", ALL)
@pytest.mark.parametrize("direct", [True, False])
def test_backends_read_pythons_bytes(data_file, probed, backend, direct):
    if not probed.verdict(backend).usable:
        pytest.skip(f"{backend}: {probed.verdict(backend).reason}")
    want = data_file.read_bytes()
    n_blocks = -(-SIZE // 4096)
    rng = random.Random(f"{backend}{direct}")
    reqs = random_requests(rng, n_blocks, 60)
    bufs = [fio.aligned(length) for _, length in reqs]
    with cio.FlashFile(data_file, backend, queue_depth=8, direct=direct) as f:
        got = f.read_all([(o, n, b, 1000 + i) for i, ((o, n), b) in enumerate(zip(reqs, bufs))])
        assert f.in_flight == 0
    for i, ((off, length), buf, c) in enumerate(zip(reqs, bufs, got)):
        expect = want[off:off + length]
        assert c.user == 1000 + i
        assert c.nbytes == len(expect)
        assert c.error == 0, (off, length, os.strerror(c.error))   # the file's end inside a request is not an error
        assert bytes(buf[:c.nbytes]) == expect


@pytest.mark.parametrize("backend", ALL)
def test_submit_and_reap_by_hand(data_file, probed, backend):
    """More requests than the queue depth: submit takes what fits, reap frees room, every tag comes back once."""
    if not probed.verdict(backend).usable:
        pytest.skip(probed.verdict(backend).reason)
    want = data_file.read_bytes()
    reqs = [(i * 4096, 4096, fio.aligned(4096), i) for i in range(30)]
    seen = {}
    with cio.FlashFile(data_file, backend, queue_depth=4) as f:
        pending = list(reqs)
        while pending or f.in_flight:
            k = f.submit(pending)
            assert k <= 4
            pending = pending[k:]
            for c in f.reap(8, 1):
                seen[c.user] = c
    assert sorted(seen) == list(range(30))
    for off, _, buf, user in reqs:
        assert seen[user].error == 0 and bytes(buf) == want[off:off + 4096]


@pytest.mark.parametrize("backend", ALL)
def test_per_request_errors(data_file, probed, backend):
    if not probed.verdict(backend).usable:
        pytest.skip(probed.verdict(backend).reason)
    good = fio.aligned(8192)
    odd = fio.aligned(8192 + 4096)[1:8193]          # a destination one byte off alignment
    n_blocks = -(-SIZE // 4096)
    reqs = [(0, 4096, good, 0),
            (n_blocks * 4096, 4096, fio.aligned(4096), 1),      # starts at the end of the file
            ((n_blocks + 10) * 4096, 8192, fio.aligned(8192), 2),
            (100, 4096, fio.aligned(4096), 3),                  # misaligned offset
            (4096, 1000, fio.aligned(4096), 4),                 # misaligned length
            (4096, 4096, odd, 5),                               # misaligned destination
            (8192, 0, fio.aligned(4096), 6)]                    # empty
    with cio.FlashFile(data_file, backend, queue_depth=4) as f:
        got = f.read_all(reqs)
    assert [(c.user, c.error) for c in got] == [(0, 0), (1, errno.ENODATA), (2, errno.ENODATA), (3, errno.EINVAL),
                                                (4, errno.EINVAL), (5, errno.EINVAL), (6, errno.EINVAL)]
    assert got[0].nbytes == 4096 and all(c.nbytes == 0 for c in got[1:])


@pytest.mark.parametrize("backend", ALL)
def test_closed_descriptor(data_file, probed, backend):
    """The descriptor closed under the handle: each read reports EBADF (a mapping keeps its pages and reads on)."""
    if not probed.verdict(backend).usable:
        pytest.skip(probed.verdict(backend).reason)
    want = data_file.read_bytes()
    f = cio.FlashFile(data_file, backend, queue_depth=4)
    os.close(f.info["fd"])
    bufs = [fio.aligned(4096) for _ in range(3)]
    got = f.read_all([(i * 4096, 4096, b, i) for i, b in enumerate(bufs)])
    f.close()
    if backend == "mmap":
        assert all(c.error == 0 for c in got) and bytes(bufs[2]) == want[8192:12288]
    else:
        assert [c.error for c in got] == [errno.EBADF] * 3


def test_short_read_of_a_file_truncated_under_the_handle(tmp_path, probed):
    p = tmp_path / "shrinks.bin"
    p.write_bytes(os.urandom(8 * 4096))
    for backend in ("pread", "aio", "uring"):
        if not probed.verdict(backend).usable:
            continue
        with cio.FlashFile(p, backend, queue_depth=2, direct=False) as f:
            os.truncate(p, 5 * 4096 + 100)
            got = f.read_all([(4 * 4096, 8192, fio.aligned(8192), 0), (6 * 4096, 4096, fio.aligned(4096), 1)])
            assert [(c.error, c.nbytes) for c in got] == [(errno.ENODATA, 4096 + 100), (errno.ENODATA, 0)], backend
        p.write_bytes(os.urandom(8 * 4096))


def test_bad_parameters(data_file):
    with pytest.raises(UsageError):
        cio.FlashFile(data_file, "auto")
    with pytest.raises(EngineError, match="queue depth 0"):
        cio.FlashFile(data_file, "pread", queue_depth=0)
    with pytest.raises(EngineError, match="cannot open"):
        cio.FlashFile(data_file.parent / "missing.bin", "pread")
    with cio.FlashFile(data_file, "pread", queue_depth=4) as f:
        with pytest.raises(EngineError, match="not in 1..4"):
            f.bench(4096, 8, 0.01)
        with pytest.raises(EngineError, match="not a multiple of 4096"):
            f.bench(1000, 1, 0.01)


def test_parse_io():
    assert [fio.parse_io(v) for v in ("auto", "URING", "io_uring", "aio", "linux-aio", "pread", "mmap")] == [
        "auto", "uring", "uring", "aio", "aio", "pread", "mmap"]
    with pytest.raises(UsageError, match="--io must be one of"):
        fio.parse_io("spdk")


# ---- the probe ----

def test_probe_picks_a_working_backend(data_file, probed):
    assert [v.backend for v in probed.verdicts] == list(ALL)
    assert probed.chosen in ALL
    chosen = probed.verdict(probed.chosen)
    assert chosen.usable
    first_ok = [v.backend for v in probed.verdicts if v.status == "ok"]
    assert probed.chosen == (first_ok[0] if first_ok else next(v.backend for v in probed.verdicts if v.usable))
    assert probed.verdict("pread").usable           # pread works wherever the file can be read
    for v in probed.verdicts:
        assert v.status in fio.VERDICTS and v.reason
    # io_uring reported truthfully: either it worked in the child, or the child says why not
    u = probed.verdict("uring")
    if u.usable:
        assert u.reason.startswith(("O_DIRECT", "buffered")), u.reason
        with cio.FlashFile(data_file, "uring", queue_depth=2) as f:   # cleared for this process
            assert f.info["backend"] == "uring"
    else:
        assert u.status in ("refused", "unavailable") and u.reason
    assert fio.resolve("auto", data_file) == (probed.chosen, probed)


def test_probe_refuses_uring_killed_by_seccomp(data_file):
    """A child whose io_uring_setup is trapped by a seccomp filter (Android's SECCOMP_RET_TRAP) dies of
    SIGSYS: the probe reports uring refused, survives, and picks another backend."""
    res = cio.probe(data_file, test_flags=cio.PROBE_TEST_SECCOMP_URING)
    u = res.verdict("uring")
    assert (u.status, u.signal) == ("refused", 31) and "seccomp" in u.reason
    assert res.chosen in ("aio", "pread", "mmap") and res.verdict(res.chosen).usable
    res = cio.probe(data_file, test_flags=cio.PROBE_TEST_RAISE_SIGSYS)
    assert res.verdict("uring").status == "refused" and res.chosen != "uring"


def test_probe_sees_aio_block_without_o_direct(tmp_path):
    """Where O_DIRECT is not in effect (as on a file system that silently ignores it), Linux AIO reads
    inside io_submit, one read after another: the probe must call that serial, and not pick it."""
    p = tmp_path / "cold.bin"
    with open(p, "wb") as fh:
        fh.write(os.urandom(4 << 20))
        fh.flush()
        os.fsync(fh.fileno())
    res = fio.probe(p, buffered=True)
    aio = res.verdict("aio")
    assert not aio.direct and aio.reason.startswith("buffered")
    if "come from memory" in aio.reason:
        pytest.skip("this file system serves the file from memory: nothing to time")
    assert aio.status == "serial", aio.reason
    assert aio.submit_us > 0.5 * aio.batch_us          # the time went inside io_submit
    assert res.chosen != "aio" and res.verdict(res.chosen).status == "ok"


def test_uring_is_refused_before_a_probe():
    """In a fresh process nothing may call io_uring before the probe has cleared it."""
    import subprocess
    import sys
    code = ("import sys\nfrom pi2.engine import flash_io as f\n"
            "from pi2.errors import UnsupportedError\n"
            "try:\n    f.FlashFile(sys.executable, 'uring')\n"
            "except UnsupportedError as e:\n    print('refused:', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.startswith("refused: io_uring has not been probed safe"), out.stdout + out.stderr


def test_probe_missing_file(tmp_path):
    with pytest.raises(UsageError, match="cannot probe"):
        fio.probe(tmp_path / "nope")


# ---- O_DIRECT and its fallback ----

def test_o_direct_fallback(data_file, tmp_path):
    want = data_file.read_bytes()
    for flag, note in ((cio.TEST_DIRECT_OPEN_EINVAL, "EINVAL at open"),
                       (cio.TEST_DIRECT_READ_EINVAL, "aligned O_DIRECT read failed with EINVAL")):
        with cio.FlashFile(data_file, "pread", queue_depth=2, test_flags=flag) as f:
            assert f.info["direct"] is False and note in f.info["note"]
            buf = fio.aligned(8192)
            assert f.read_all([(4096, 8192, buf, 0)])[0].error == 0 and bytes(buf) == want[4096:12288]
    # a tmpfs file: older kernels refuse O_DIRECT there (EINVAL), newer ones accept it; either way it reads
    shm = "/dev/shm"
    if os.path.isdir(shm):
        p = os.path.join(shm, f"pi2-test-{os.getpid()}.bin")
        with open(p, "wb") as fh:
            fh.write(want)
        try:
            try:
                os.close(os.open(p, os.O_RDONLY | os.O_DIRECT))
                accepts = True
            except OSError:
                accepts = False
            with cio.FlashFile(p, "pread", queue_depth=2) as f:
                assert f.info["direct"] is accepts
                if not accepts:
                    assert "EINVAL at open" in f.info["note"]
                buf = fio.aligned(4096)
                assert f.read_all([(8192, 4096, buf, 0)])[0].error == 0 and bytes(buf) == want[8192:12288]
        finally:
            os.unlink(p)


def test_buffered_reads_leave_no_page_cache(tmp_path):
    """Buffered (no O_DIRECT) reads drop what they read from the page cache when drop_cache is on."""
    import mmap as mm
    import ctypes
    p = tmp_path / "cache.bin"
    p.write_bytes(os.urandom(64 * 4096))
    os.sync()

    def resident() -> int:
        libc = ctypes.CDLL(None, use_errno=True)
        vec = (ctypes.c_ubyte * 64)()
        with open(p, "rb") as fh, mm.mmap(fh.fileno(), 0, prot=mm.PROT_READ) as m:
            view = np.frombuffer(m, dtype=np.uint8)
            rc = libc.mincore(ctypes.c_void_p(view.ctypes.data), ctypes.c_size_t(64 * 4096), vec)
            del view
        assert rc == 0
        return sum(v & 1 for v in vec)

    for drop in (False, True):
        with cio.FlashFile(p, "pread", queue_depth=4, direct=False, drop_cache=drop) as f:
            f.drop_cache()
            if resident() != 0:
                pytest.skip("this file system keeps pages posix_fadvise cannot drop (tmpfs?)")
            got = f.read_all([(i * 8192, 4096, fio.aligned(4096), i) for i in range(32)])
            assert all(c.error == 0 for c in got)
            n = resident()
        assert (n == 0) if drop else (n >= 32), (drop, n)
    with cio.FlashFile(p, "mmap", queue_depth=4) as f:      # a mapping's pages leave with drop_cache
        assert all(c.error == 0 for c in f.read_all([(i * 8192, 8192, fio.aligned(8192), i) for i in range(32)]))
        assert resident() == 64
        f.drop_cache()
        assert resident() == 0


# ---- the device profile ----

def test_profile_cache_written_and_reused(data_file, tmp_path):
    from pi2.plan import profile as pf
    grid = {"blocks": (4096, 16384), "depths": (1, 4), "seconds": 0.02}
    prof, reused = pf.load_or_measure(data_file, cache_dir=tmp_path, **grid)
    cf = tmp_path / "devices" / f"{pf.device_key(data_file)}.json"
    st = os.stat(data_file)
    assert pf.device_key(data_file).startswith(f"dev{os.major(st.st_dev)}-{os.minor(st.st_dev)}-fs")
    assert not reused and cf.exists() and json.loads(cf.read_text()) == prof
    assert prof["backend"] in ALL and prof["date"] and prof["file"] == str(data_file)
    assert [(p["block"], p["qd"]) for p in prof["points"]] == [(4096, 1), (4096, 4), (16384, 1), (16384, 4)]
    assert all(p["mb_s"] > 0 and p["reads"] > 0 and p["errors"] == 0 for p in prof["points"])
    # the cache is what a second call returns: mark it and read the mark back
    marked = dict(prof, points=[dict(p, mb_s=12345.0) for p in prof["points"]])
    cf.write_text(json.dumps(marked))
    again, reused = pf.load_or_measure(data_file, cache_dir=tmp_path, **grid)
    assert reused and again == marked and pf.throughput(again, 4096, 4) == 12345.0
    # a point outside the cached grid, another backend, or --refresh measure again
    other = "pread" if prof["backend"] != "pread" else "mmap"
    for kw in ({"blocks": (4096, 32768)}, {"io": other}, {"refresh": True}):
        prof2, reused = pf.load_or_measure(data_file, cache_dir=tmp_path, **{**grid, **kw})
        assert not reused and 12345.0 not in [p["mb_s"] for p in prof2["points"]], kw
    assert prof2["backend"] == prof["backend"]      # the refresh ran auto again
    cf.write_text("{not json")
    assert pf.load_or_measure(data_file, cache_dir=tmp_path, **grid)[1] is False


def test_cli_profile_io(data_file, tmp_path):
    res = cli("profile-io", "-m", data_file, "--cache-dir", tmp_path, "--seconds", "0.01", "--json")
    assert res.code == 0, res.err
    prof = json.loads(res.out)
    assert len(prof["points"]) == 28
    big = [p for p in prof["points"] if p["block"] > SIZE]
    assert big and all(p["mb_s"] is None for p in big)       # 512K does not fit in this file
    text = cli("profile-io", data_file, "--cache-dir", tmp_path, "--seconds", "0.01").out
    assert "| block | QD 1 | QD 4 | QD 16 | QD 32 |" in text and "(cached: " in text and "\n| 512K | - | - | - | - |" in text
    assert_error(cli("profile-io", "-m", tmp_path / "none.bin", "--cache-dir", tmp_path), code=1, match="cannot read")
    assert_error(cli("profile-io", data_file, "--io", "spdk", "--cache-dir", tmp_path), code=2, match="--io must be")
    assert_error(cli("profile-io", data_file, "--seconds", "0", "--cache-dir", tmp_path), code=2, match="--seconds")
    tiny = tmp_path / "tiny.bin"
    tiny.write_bytes(b"x" * 100)
    assert_error(cli("profile-io", tiny, "--refresh", "--cache-dir", tmp_path), code=1, match="smaller than one 4 KiB block")
