"""test_budget_plan.py — the planner of `--memory-budget` (pi2/plan/budget.py) and its CLI: sizes, the floor and
the split into hot prefixes and cold slots, the cluster from the device profile, early reads, the gate rows
streamed below the mapped-gate floor, the memory a run may use without the flag, and `pi2 run/plan/bench` with it."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest
from fixtures import write_model
from pi2file import convert_pi2
from stream_files import ctx_for, files, run  # noqa: F401 (files: the fixture)

from pi2.engine import CModel, stream_sizes
from pi2.errors import UsageError
from pi2.model.loader import load_model

def test_parse_size():
    from pi2.errors import UsageError
    from pi2.runtime.config import parse_size
    assert parse_size("500M") == 500 << 20 and parse_size("1.5G") == 3 << 29 and parse_size("64k") == 65536
    assert parse_size("800MiB") == 800 << 20 and parse_size("4096") == 4096
    for bad in ("", "abc", "5X", "-1M", "0"):
        with pytest.raises(UsageError):
            parse_size(bad)


def test_plan_split(files):
    from pi2.errors import UsageError
    from pi2.plan.budget import make_plan
    m = load_model(files["q8"])
    cm = CModel.from_model(m)
    kw = dict(io="pread", cluster=64, runtime=50 << 20)
    small = make_plan(m, cm, 1 << 40, 64, 1, **kw)
    with pytest.raises(UsageError, match="below the minimum of"):
        make_plan(m, cm, small.floor - 4096, 64, 1, **kw)
    bb = stream_sizes(cm, 64)["bundle_bytes"]
    tight = make_plan(m, cm, small.floor + 8192 * 2 + 3 * 64 * bb + 100, 64, 1, **kw)   # three clusters hot
    freq = [m.raw(f"blk.{il}.ffn_freq.weight").view(np.float32).reshape(-1) for il in range(m.config.n_layer)]
    hottest = sorted((-float(f[c:c + 64].mean()), il) for il, f in enumerate(freq) for c in range(0, f.size, 64))[:3]
    assert tight.n_hot == [64 * sum(1 for _, i in hottest if i == il) for il in range(m.config.n_layer)]
    assert tight.n_slots == tight.min_slots and 0 < sum(tight.n_hot) < m.config.n_ff * m.config.n_layer
    assert all(h % 64 == 0 for h in tight.n_hot)
    assert tight.floor + tight.hot_bytes + (tight.n_slots - tight.min_slots) * tight.slot_bytes <= tight.budget
    assert sum(small.n_hot) == m.config.n_ff * m.config.n_layer       # everything fits: all hot, no extra slots
    assert small.n_slots == small.min_slots
    # the split streams bit-identically
    want = run(ctx_for(files["q8"], 0.5, 1))
    assert np.array_equal(run(ctx_for(files["q8"], 0.5, 2, tight.stream_args())), want)


def test_cli_budget(files):
    from clirun import cli
    from pi2.plan.budget import make_plan
    path = str(files["q8"])
    base = cli("run", path, "-p", "hello", "-n", "6", "--temp", "0", "--json", "-c", "64")
    assert base.code == 0, base.err
    low = cli("run", path, "-p", "hello", "-n", "6", "--temp", "0", "-c", "64", "--memory-budget", "1M")
    assert low.code != 0 and "below the minimum of" in low.err and "Traceback" not in low.err
    m = load_model(files["q8"])
    need = make_plan(m, CModel.from_model(m), 1 << 40, 64, 1).floor
    budget = f"{(need >> 20) + 40}M"
    res = cli("run", path, "-p", "hello", "-n", "6", "--temp", "0", "--json", "-c", "64", "--memory-budget", budget,
              "--io", "pread", "--verbose")
    assert res.code == 0, res.err
    assert json.loads(res.out)["tokens"] == json.loads(base.out)["tokens"]
    assert "pi2: cache: hit rate" in res.err
    bad = cli("run", path, "-p", "hello", "-n", "2", "--memory-budget", budget, "--io", "floppy")
    assert bad.code != 0 and "--io must be one of" in bad.err
    plan = cli("plan", "-m", path, "--memory-budget", budget, "-c", "64", "--io", "pread")
    assert plan.code == 0 and "hot prefix" in plan.out and "cold cache" in plan.out, plan.err
    assert "flash per token" in plan.out and "predicted" in plan.out
    plain = cli("run", str(files["plain"]), "-p", "hello", "-n", "2", "-c", "64", "--memory-budget", "1M")
    assert plain.code == 0 and "not enforced" in plain.err and "pi2 convert" in plain.err, plain.err
    gud = cli("plan", "-m", str(files["gud"]), "--memory-budget", "1G")
    assert gud.code != 0 and "bundle-ud" in gud.err
    b = cli("bench", path, "-p", "4", "-n", "4", "-r", "1", "-o", "json", "--memory-budget", budget, "--io", "pread",
            timeout=120)
    assert b.code == 0, b.err
    recs = json.loads(b.out)
    tg = [r for r in recs if r["n_gen"] == 4][0]
    assert 0 <= tg["pi2_cache_hit_rate"] <= 1 and tg["pi2_flash_bytes_per_token"] >= 0
    assert 0 <= tg["pi2_io_wait_share"] <= 1 and "pi2_read_mbps" in tg


def test_plan_flash_bytes_follow_the_hot_prefix(files):
    """Expected flash bytes per token: every cold cluster with an active neuron (by ffn_freq) read once; none when
    all is hot; fewer as the hot prefix grows."""
    from pi2.plan.budget import make_plan
    m = load_model(files["q8"])
    cm = CModel.from_model(m)
    kw = dict(io="pread", cluster=64, runtime=50 << 20)
    base = make_plan(m, cm, 1 << 40, 64, 1, **kw)
    assert sum(base.n_hot) == m.config.n_ff * m.config.n_layer and base.flash_bytes == 0
    bb = stream_sizes(cm, 64)["bundle_bytes"]
    none = make_plan(m, cm, base.floor + 100, 64, 1, **kw)
    some = make_plan(m, cm, base.floor + 8192 * 2 + 3 * 64 * bb + 100, 64, 1, **kw)
    assert sum(none.n_hot) == 0 and none.flash_bytes > some.flash_bytes > 0
    freq = [np.asarray(m.raw(f"blk.{il}.ffn_freq.weight")).view(np.float32).reshape(-1)
            for il in range(m.config.n_layer)]
    p_need = sum(1 - np.prod(1 - f[c * 64:(c + 1) * 64].astype(np.float64)) for f in freq for c in range(5))
    assert none.flash_bytes == int(p_need * min(none.slot_bytes, 64 * bb + 4096))


def test_plan_cluster_from_device_profile(files, tmp_path, monkeypatch):
    """With no cluster given, the planner takes the cluster whose expected reads finish first on the device profile:
    a device much faster at big reads gets 64-neuron clusters; one as fast at every size the plan reading the fewest
    bytes; no profile: cluster_for's rule. An explicit cluster is kept."""
    from pi2.plan import profile
    from pi2.plan.budget import cluster_for, make_plan
    m = load_model(files["q8"])
    cm = CModel.from_model(m)
    monkeypatch.setattr(profile, "default_cache_dir", lambda: tmp_path)
    kw = dict(io="pread", runtime=50 << 20)
    floor = max(make_plan(m, cm, 1 << 40, 64, 1, cluster=c, **kw).floor for c in (8, 16, 32, 64))
    budget = floor + 8192 * 2 + 100                    # nothing hot: every active cluster is read
    assert make_plan(m, cm, budget, 64, 1, **kw).cluster == cluster_for(stream_sizes(cm, 64)["bundle_bytes"])

    def write(mbps_of_block):
        f = profile.cache_file(files["q8"])
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps({"backend": "pread", "points": [
            {"block": b, "qd": 32, "mb_s": mbps_of_block(b)} for b in (4096, 8192, 16384, 32768, 65536, 131072)]}))

    write(lambda b: b / 64.0)                           # throughput grows with the read size
    fast = make_plan(m, cm, budget, 64, 1, **kw)
    assert fast.cluster == 64 and fast.read_mbps > make_plan(m, cm, budget, 64, 1, cluster=8, **kw).read_mbps
    write(lambda b: 500.0)                              # flat: the fewest expected bytes win
    flat = make_plan(m, cm, budget, 64, 1, **kw)
    each = [make_plan(m, cm, budget, 64, 1, cluster=c, **kw) for c in (8, 16, 32, 64)]
    assert flat.read_seconds == min(p.read_seconds for p in each)
    assert flat.flash_bytes == min(p.flash_bytes for p in each) < max(p.flash_bytes for p in each)
    assert make_plan(m, cm, budget, 64, 1, cluster=16, **kw).cluster == 16


def test_no_budget_fits_the_memory_the_process_may_use(files, tmp_path, monkeypatch):
    """Without --memory-budget a pi2 file larger than the memory the process may use streams within that limit
    (same tokens as the mapped run); a plain GGUF that does not fit runs from its mapping and suggests pi2 convert;
    files that fit run mapped with nothing said; a limit below the floor is refused with the minimum."""
    from clirun import cli
    from pi2.plan import devices
    from pi2.plan.budget import context_bytes, make_plan
    src = write_model(tmp_path / "big.gguf", wtype="Q8_0", n_ff=2048, n_embd=512, n_layer=6, n_head=8, n_head_kv=4)
    path = str(convert_pi2(src, tmp_path / "big.pi2.gguf", down_type="Q8_0", default_keep=0.5))
    args = ("run", path, "-p", "hello", "-n", "6", "--temp", "0", "--json", "-c", "64", "--io", "pread", "--verbose")
    base = cli(*args)
    assert base.code == 0 and "may use" not in base.err and "pi2: cache:" not in base.err, base.err
    m = load_model(path)
    limit = make_plan(m, CModel.from_model(m), 1 << 40, 64, 1).floor + (4 << 20)   # 5 of 6 layers' bundles short
    monkeypatch.setattr(devices, "memory_limit", lambda: limit)
    res = cli(*args)
    assert res.code == 0, res.err
    assert f"may use {limit / 2**20:.1f} MiB: its FFN streams" in res.err and "pi2: cache: hit rate" in res.err
    assert json.loads(res.out)["tokens"] == json.loads(base.out)["tokens"]
    plain = cli("run", str(src), "-p", "hello", "-n", "2", "-c", "64")
    assert plain.code == 0 and "runs from its mapping" in plain.err and "pi2 convert" in plain.err, plain.err
    kv = sum(context_bytes(CModel.from_model(m), 64, 1))    # room for the KV cache, not the fixed region
    monkeypatch.setattr(devices, "memory_limit", lambda: kv + (1 << 20))
    low = cli(*args)
    assert low.code != 0 and "below the minimum of" in low.err and "Traceback" not in low.err
    monkeypatch.setattr(devices, "memory_limit", lambda: 1 << 20)      # not even the KV cache: refused by -c
    low = cli(*args)
    assert low.code == 2 and "for its KV cache and buffers" in low.err and "give -c" in low.err, low.err


def test_memory_limit_reads_meminfo_and_cgroup(monkeypatch):
    from pi2.plan import devices
    monkeypatch.setattr(devices, "cgroup_limit", lambda: None)
    meminfo = "MemTotal:       1000000 kB\nMemAvailable:    500000 kB\n"
    free = devices.memory_limit(meminfo)
    assert free >= 500000 * 1024 and free < 500000 * 1024 + (8 << 30)   # + this process's RSS
    monkeypatch.setattr(devices, "cgroup_limit", lambda: 300 << 20)
    assert devices.memory_limit(meminfo) == 300 << 20
    assert devices.memory_limit("nothing here\n") is None


def test_plan_early_reads(files):
    """The plan reads before attention the leading cold clusters whose chance of being needed is >= EARLY_P (at
    most a queue's worth per layer), passes them to the cache, and none when the gate rows stream."""
    from pi2.plan.budget import EARLY_P, make_plan
    m = load_model(files["q8"])
    cm = CModel.from_model(m)
    base = make_plan(m, cm, 1 << 40, 64, 1, io="pread", cluster=8, runtime=50 << 20)
    p = make_plan(m, cm, base.floor + 100, 64, 1, io="pread", cluster=8, runtime=50 << 20)
    n_cl = m.config.n_ff // 8
    for il, e in enumerate(p.n_early):
        f = np.asarray(m.raw(f"blk.{il}.ffn_freq.weight")).view(np.float32).reshape(-1).astype(np.float64)
        need = 1 - np.prod(1 - f.reshape(n_cl, 8), axis=1)
        h = p.n_hot[il] // 8
        assert 0 <= e <= min(p.queue_depth, n_cl - h)
        assert np.all(need[h:h + e] >= EARLY_P) and (e == min(p.queue_depth, n_cl - h) or need[h + e] < EARLY_P)
    assert p.stream_args()["n_early"] == p.n_early
    assert sum(base.n_early) == 0                     # all hot: nothing to read


def test_budget_below_the_mapped_gate_floor_streams_the_gate_rows(tmp_path, monkeypatch):
    """A budget below the floor with the gate rows mapped streams them too, read whole each token (any rule): the
    plan says so, the tokens equal the mapped run's, and the refusal below that gives the lower minimum."""
    # The process's RSS is held still: in a long suite it drifts by more than the 2 MiB between the budget asked
    # of `pi2 run` below and the mapped floor measured before it.
    monkeypatch.setattr("pi2.plan.budget.runtime_rss", lambda model=None: 60 << 20)
    monkeypatch.setattr("pi2.runtime.plan.runtime_rss", lambda model=None: 60 << 20)
    from clirun import cli
    from pi2.plan.budget import make_plan
    src = write_model(tmp_path / "g.gguf", wtype="Q8_0", n_ff=2048, n_embd=512, n_layer=6, n_head=8, n_head_kv=4)
    path = convert_pi2(src, tmp_path / "g.pi2.gguf", down_type="Q8_0", default_keep=0.5)
    m = load_model(path)
    cm = CModel.from_model(m)
    kw = dict(io="pread", cluster=64, runtime=50 << 20)
    mapped = make_plan(m, cm, 1 << 40, 64, 1, **kw)
    assert not mapped.gate_whole and "n_gate_hot" not in mapped.stream_args()
    p = make_plan(m, cm, mapped.floor - 4096, 64, 1, **kw)
    assert p.gate_whole and not p.gate and p.floor < mapped.floor and p.floor_mapped_gate == mapped.floor
    assert p.fixed < mapped.fixed and p.gate_flash_bytes == p.gate_bytes > 0
    args = p.stream_args()
    assert args["stream_gate"] and args["n_gate_hot"] == [0] * m.config.n_layer and "n_early" not in args
    assert any("read whole each token" in line for line in p.lines())
    want = run(ctx_for(path, 0.5, 1))
    assert np.array_equal(run(ctx_for(path, 0.5, 2, args)), want)
    with pytest.raises(UsageError, match=f"minimum of {p.floor / 2**20:.1f} MiB"):
        make_plan(m, cm, p.floor - 4096, 64, 1, **kw)
    base = cli("run", str(path), "-p", "hello", "-n", "6", "--temp", "0", "--json", "-c", "64")
    need = make_plan(m, cm, 1 << 40, 64, 1, io="pread").floor
    res = cli("run", str(path), "-p", "hello", "-n", "6", "--temp", "0", "--json", "-c", "64", "--io", "pread",
              "--memory-budget", f"{(need >> 20) - 2}M", "--verbose")
    assert res.code == 0 and "gate rows read whole each token" in res.err, res.err
    assert "read whole (prompt batches, gate rows), 100% of them submitted before their FFN" in res.err, res.err
    assert json.loads(res.out)["tokens"] == json.loads(base.out)["tokens"]


def test_plan_and_run_share_one_minimum(files):
    """min_budget is the one minimum: the same whatever budget was asked for, named by a refused budget, accepted
    at exactly its value; `pi2 plan` prints it and `pi2 run` refuses just below it."""
    from clirun import cli
    from pi2.plan.budget import fmt, make_plan, measured_runtime, min_budget
    m = load_model(files["q8"])
    cm = CModel.from_model(m)
    kw = dict(io="pread", runtime=50 << 20)
    need = min_budget(m, cm, 64, 1, **kw)
    for budget in (need, need + (3 << 20), 1 << 40):
        assert make_plan(m, cm, budget, 64, 1, **kw).minimum == need
    with pytest.raises(UsageError, match=f"below the minimum of {fmt(need)}"):
        make_plan(m, cm, need - 1, 64, 1, **kw)
    assert measured_runtime(m) % (4 << 20) == 0
    path = str(files["q8"])
    shown = set()
    for budget in ("64M", "900M", "4G"):
        res = cli("plan", "-m", path, "--memory-budget", budget, "-c", "64", "-t", "1", "--io", "pread")
        found = re.search(r"minimum (?:of |for this model and context: )([0-9.]+ MiB)", res.out + res.err)
        shown.add(found.group(1))
    assert len(shown) == 1        # the same minimum whatever was asked
