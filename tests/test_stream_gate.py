"""test_stream_gate.py — two-phase loading (csrc/cache/cache.c, pipeline/units.c, ffn/predicted.c): with the file's predictor, a
streamed context also serves its gate rows from the neuron cache (a hot prefix and an LRU of gate-cluster slots
read by the flash I/O backend): one token reads the gate clusters of its predicted set P, a batch reads a layer's
gate region whole. Logits are bit-identical to the mapped run with the same predictor and keep for any hot count,
cluster size and thread count, with the four-row kernel on Q4_K gate rows; reads happen only for P's cold
clusters; the gate pages stay out of the page cache; a short gate read is a clean PI2_ERR_IO; the planner drops
the gate rows from the fixed region and the floor, and `pi2 plan --predictor` prints the gate split (the slot LRU
itself: test_cache_pool.py)."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from clirun import cli
from decode_seq import TOKENS, run
from fixtures import write_model
from gguf import GGMLQuantizationType as QT
from gguf import GGUFReader
from pagecache import cold_copy, resident_pages
from pi2file import writer_like

from pi2.convert import convert, predictor
from pi2.engine import CContext, CModel, ffi, lib, stream_sizes
from pi2.engine.lib import last_error
from pi2.errors import EngineError
from pi2.model.loader import load_model
from pi2.plan.budget import fixed_bytes, make_plan
from pi2.runtime import ffn_rule


def _rewrite(src, dst, replace=None, last=()):
    """src's GGUF written again to dst: tensors named in `replace` get the given (bytes, type), those in `last` go
    after all the others."""
    r = GGUFReader(str(src))
    w = writer_like(r, dst)
    replace = replace or {}
    for t in sorted(r.tensors, key=lambda t: t.name in last):
        data, qtype = replace.get(t.name, (np.asarray(t.data), t.tensor_type))
        w.add_tensor(t.name, data, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def _q4k_rows(n_rows: int, n_cols: int, seed: int) -> np.ndarray:
    """n_rows random Q4_K rows of n_cols values: d ~ 1e-3, dmin ~ 2e-4, random 6-bit scales and nibbles."""
    rng = np.random.default_rng(seed)
    nb = n_rows * n_cols // 256
    blk = np.zeros((nb, 144), np.uint8)
    blk[:, 0:2] = rng.uniform(5e-4, 1.5e-3, nb).astype(np.float16).view(np.uint8).reshape(nb, 2)
    blk[:, 2:4] = rng.uniform(0, 4e-4, nb).astype(np.float16).view(np.uint8).reshape(nb, 2)
    blk[:, 4:] = rng.integers(0, 256, (nb, 140), dtype=np.uint8)
    return blk.reshape(n_rows, -1)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Converted files with a low-bit predictor: Q4_K gate rows (the four-row kernel, n_ff 320: five groups) and
    Q4_1 gate rows; and the Q4_1 one with every layer's gate rows at the end of the file."""
    d = tmp_path_factory.mktemp("sgate")
    base = write_model(d / "m.gguf", wtype="Q8_0", n_embd=256, n_ff=320, n_layer=2, seed=5)
    q4k = _rewrite(base, d / "q4k.gguf", {f"blk.{il}.ffn_gate.weight": (_q4k_rows(320, 256, il), QT.Q4_K)
                                           for il in range(2)})
    q41 = write_model(d / "q41.gguf", wtype="Q4_1", n_embd=96, n_ff=192, n_layer=4, seed=3)
    spec = predictor.Spec("lowbit", "ffn_norm", bits=2)
    out = {"q4k": convert(q4k, d / "q4k.pi2.gguf", progress=False, pred=spec, calib_tokens=512).output,
           "q41": convert(q41, d / "q41.pi2.gguf", progress=False, pred=spec, calib_tokens=512).output}
    out["gates_last"] = _rewrite(out["q41"], d / "last.pi2.gguf", last=[f"blk.{il}.ffn_gate.weight" for il in range(4)])
    return out


def ctx_for(path, threads, stream=None, rule=None):
    m = load_model(path)
    c = CContext(CModel.from_model(m), 32, threads)
    c.set_ffn(rule or ffn_rule.choose_rule(m))
    if stream:
        c.set_stream(**stream)
    return c


def gate_stream(m, cluster, hot, ghot, extra=0):
    n = stream_sizes(CModel.from_model(m), cluster)["min_slots"]
    L = m.config.n_layer
    return dict(cluster=cluster, n_slots=n + extra, n_hot=[hot] * L, io="pread", stream_gate=True,
                n_gate_slots=n + extra, n_gate_hot=[ghot] * L)


@pytest.mark.parametrize("name", ["q4k", "q41"])
def test_streamed_gate_equals_mapped(files, name):
    m = load_model(files[name])
    assert ffn_rule.choose_rule(m).rule == "predicted"
    want = run(ctx_for(files[name], 1))
    F, L = m.config.n_ff, m.config.n_layer
    cases = [  # (cluster, bundle hot, gate hot, slots beyond the minimum, threads)
        (8, 0, 0, 0, 1), (16, 0, 0, 0, 2), (64, 0, 0, 0, 2),  # everything cold, one layer's slots
        (16, 64, 40, 3, 1),                                   # some hot; the gate prefix not on a cluster boundary
        (8, 0, 136, 1000, 2),                                 # big: every gate cluster stays once read
        (64, F, F, 0, 1), (8, 0, F, 0, 2),                    # all hot; only the gate rows hot
    ]
    for cluster, hot, ghot, extra, threads in cases:
        c = ctx_for(files[name], threads, gate_stream(m, cluster, hot, ghot, extra))
        assert np.array_equal(run(c), want), (cluster, hot, ghot, extra, threads)
        st = c.cache_stats()
        needed = st["gate_hot"] + st["gate_hits"] + st["gate_misses"]
        assert st["tokens"] == 3 and needed > 0
        if ghot == F:      # the gate region resident: nothing read, batches need no whole-layer read
            assert st["gate_misses"] == st["gate_bytes_read"] == st["gate_layer_loads"] == 0
            assert st["gate_hot_bytes"] > 0
        else:              # two batches: every layer's gate region read whole twice
            assert st["gate_misses"] > 0 and st["gate_layer_loads"] == 2 * L
            assert st["layer_loads_ahead"] == st["layer_loads"] + 2 * L     # batches: read before their FFN
            assert st["gate_bytes_read"] >= st["gate_misses"] * 4096
        if ghot == 0:
            assert st["gate_hot"] == 0 and st["gate_hot_bytes"] == 0
        if extra >= 1000:
            assert st["gate_hits"] > 0


def test_other_rules_read_the_gate_region_whole(files):
    """Gate streaming under a rule without the predictor: every gate row is needed, so each single token reads
    each layer's gate region whole; still bit-identical to the mapped run."""
    m = load_model(files["q41"])
    thr = ffn_rule.choose_rule(m, use_predictor=False)
    assert thr.rule == "threshold"
    want = run(ctx_for(files["q41"], 1, rule=thr))
    c = ctx_for(files["q41"], 2, gate_stream(m, 16, 0, 0), rule=thr)
    assert np.array_equal(run(c), want)
    st = c.cache_stats()
    assert st["gate_layer_loads"] == 5 * m.config.n_layer and st["gate_misses"] == 0   # 2 batches + 3 tokens
    assert st["layer_loads_ahead"] == st["layer_loads"] + st["gate_layer_loads"]   # all submitted before the FFN


def test_gate_reads_only_p_cold_clusters(files):
    """One token reads exactly the gate clusters of P (the gate rows it computed, seen by the trace) that are cold and
    not in a slot: after a batch (which leaves no gate cluster in a slot) every one of them, one read each."""
    m = load_model(files["q41"])
    F, L = m.config.n_ff, m.config.n_layer
    cm = CModel.from_model(m)
    for cluster, ghot in ((8, 0), (16, 48)):
        c = ctx_for(files["q41"], 1, gate_stream(m, cluster, 0, ghot))
        c.decode(TOKENS[:8])
        seen = {}
        c.set_trace(lambda name, il, a: seen.__setitem__(il, a) if name == "ffn_gate" else None)
        before = c.cache_stats()
        c.decode([TOKENS[8]])
        st = {k: v - before[k] for k, v in c.cache_stats().items()}
        p_cl = [np.unique(np.flatnonzero(seen[il]) // cluster) for il in range(L)]
        assert all(0 < len(p) <= -(-F // cluster) for p in p_cl)
        cold = sum(int((p >= ghot // cluster).sum()) for p in p_cl)
        assert st["gate_misses"] == cold > 0 and st["gate_hits"] == 0
        assert st["gate_hot"] == sum(len(p) for p in p_cl) - cold
        sz = stream_sizes(cm, cluster)
        span = -(-cluster * sz["gate_row_bytes"] // 4096) * 4096 + 4096      # a cluster's read, at most
        assert st["gate_bytes_read"] <= cold * span and st["gate_bytes_read"] >= cold * 4096
        assert st["reads"] >= cold


def test_truncated_file_is_a_gate_read_error(files, tmp_path):
    """The file shrinks under a streamed context inside the last layer's gate rows (at the end of the file): the
    gate read fails with PI2_ERR_IO and a message, no crash, no wrong answer."""
    import shutil
    p = tmp_path / "cut.pi2.gguf"
    shutil.copy(files["gates_last"], p)
    m = load_model(p)
    L = m.config.n_layer
    last = m.tensor(f"blk.{L - 1}.ffn_gate.weight")
    assert last.offset > m.tensor(f"blk.{L - 1}.ffn_bundle.weight").offset      # the gate rows come last
    c = ctx_for(p, 1, gate_stream(m, 8, 0, 0))
    c2 = ctx_for(p, 2, gate_stream(m, 8, 0, 0))   # for a batch: the last layer's gate rows read during layer L-2
    os.truncate(p, last.offset + 4096)
    toks = np.array([TOKENS[0]], np.int32)
    logits = np.empty(m.config.n_vocab, np.float32)
    st = lib.pi2_decode(c._h, ffi.from_buffer("int32_t[]", toks), 1, ffi.from_buffer("float[]", logits), 0)
    assert st == lib.PI2_ERR_IO
    assert "gate rows of layer" in last_error()[1]
    with pytest.raises(EngineError, match="gate rows"):
        c.decode([TOKENS[1]])
    with pytest.raises(EngineError, match="gate rows"):
        c2.decode(TOKENS[:8])


def test_streamed_gate_rows_stay_out_of_the_page_cache(files, tmp_path):
    """Streamed gate rows are read with O_DIRECT and never through the mapping, nor read ahead: after single tokens
    and a batch, the pages wholly inside the gate regions are not in the page cache (with the gate rows mapped,
    they are)."""
    p, m, ranges = cold_copy(files["q4k"], tmp_path, "ffn_gate")
    assert all(e - s >= 8 * 4096 for s, e in ranges)
    c = ctx_for(p, 1, gate_stream(m, 16, 0, 0))
    for t in TOKENS[:4]:
        c.decode([t])
    c.decode(TOKENS[4:8])
    assert c.cache_stats()["gate_misses"] > 0 and c.cache_stats()["gate_layer_loads"] > 0
    assert sum(resident_pages(p, s, e) for s, e in ranges) == 0
    n = stream_sizes(CModel.from_model(m), 16)["min_slots"]
    d = ctx_for(p, 1, dict(cluster=16, n_slots=n, io="pread"))   # bundles streamed, gate rows mapped
    d.decode([TOKENS[0]])
    assert sum(resident_pages(p, s, e) for s, e in ranges) > 0


def test_bad_gate_slots_are_refused(files):
    m = load_model(files["q41"])
    n = stream_sizes(CModel.from_model(m), 16)["min_slots"]
    c = CContext(CModel.from_model(m), 32, 1)
    with pytest.raises(EngineError, match=f"gate-cluster slots.*at least {n}"):
        c.set_stream(cluster=16, n_slots=n, stream_gate=True, n_gate_slots=n - 1)
    with pytest.raises(EngineError, match="gate rows"):
        c.set_stream(cluster=16, n_slots=n, stream_gate=True, n_gate_slots=n, n_gate_hot=[-1] * m.config.n_layer)
    c.set_stream(cluster=16, n_slots=n, stream_gate=False, n_gate_slots=0)    # not streamed: the count is unused
    assert c.cache_stats()["gate_arena_bytes"] == 0


# ---- the planner and the CLI ----

def test_plan_streams_the_gate_rows(files):
    m = load_model(files["q41"])
    cm = CModel.from_model(m)
    rule = ffn_rule.choose_rule(m)
    L, F = m.config.n_layer, m.config.n_ff
    kw = dict(io="pread", cluster=64, runtime=50 << 20)   # 64 rows of 60 bytes: slots smaller than the regions
    mapped = make_plan(m, cm, 1 << 40, 64, 1, **kw)
    gated = make_plan(m, cm, 1 << 40, 64, 1, rule=rule, **kw)
    gate_region = sum(m.tensor(f"blk.{il}.ffn_gate.weight").nbytes for il in range(L))
    assert not mapped.gate and gated.gate
    thr = make_plan(m, cm, 1 << 40, 64, 1, rule=ffn_rule.choose_rule(m, use_predictor=False), **kw)
    assert not thr.gate and thr.floor == mapped.floor and "rule is threshold" in thr.gate_lines()[0]
    pred = sum(m.tensor(f"blk.{il}.ffn_gate_pred.weight").nbytes for il in range(L))   # read only when used
    assert pred > 0 and mapped.fixed - gated.fixed == gate_region - pred
    assert fixed_bytes(m, 64) - fixed_bytes(m, 64, gate=True) == gate_region - pred
    assert gated.floor == mapped.floor - gate_region + pred + gated.min_slots * gated.gate_slot_bytes
    assert sum(gated.n_gate_hot) == F * L and gated.gate_flash_bytes == 0    # all fits: everything hot
    assert 0.5 < gated.pred_share <= 1.0
    args = gated.stream_args()
    assert args["stream_gate"] and args["n_gate_slots"] >= gated.min_slots and args["n_gate_hot"] == gated.n_gate_hot
    from pi2.errors import UsageError
    with pytest.raises(UsageError, match="below the minimum of"):
        make_plan(m, cm, gated.floor - 4096, 64, 1, rule=rule, **kw)
    low = make_plan(m, cm, gated.floor + 100, 64, 1, rule=rule, **kw)         # nothing hot: every read expected
    assert sum(low.n_gate_hot) == sum(low.n_hot) == 0 and low.gate_flash_bytes > 0
    assert low.flash_bytes > low.gate_flash_bytes > 0
    gb = stream_sizes(cm, 64)["gate_row_bytes"]
    some = make_plan(m, cm, gated.floor + 16384 * L + 3 * 64 * gb + 100, 64, 1, rule=rule, **kw)
    assert sum(some.n_gate_hot) == 3 * 64 and sum(some.n_hot) == 0           # gate clusters first: worth more
    assert 0 < some.gate_flash_bytes < low.gate_flash_bytes
    assert some.floor + some.hot_bytes + some.gate_hot_bytes <= some.budget
    # the plan streams bit-identically
    want = run(ctx_for(files["q41"], 1))
    c = ctx_for(files["q41"], 2, some.stream_args())
    assert np.array_equal(run(c), want)
    assert c.stream_stats()["gate_hit_rate"] < 1.0


def test_cli_plan_and_run_with_predictor(files):
    path = str(files["q41"])
    m = load_model(files["q41"])
    need = make_plan(m, CModel.from_model(m), 1 << 40, 64, 1).floor   # this process's (the CLI runs in it)
    budget = f"{(need >> 20) + 40}M"
    plain = cli("plan", "-m", path, "--memory-budget", budget, "-c", "64", "--io", "pread", "--npu", "off", "--json")
    pred = cli("plan", "-m", path, "--memory-budget", budget, "-c", "64", "--io", "pread", "--npu", "off", "--json",
               "--predictor")
    assert plain.code == pred.code == 0, pred.err
    a, b = json.loads(plain.out), json.loads(pred.out)
    assert not a["gate"] and b["gate"] and b["n_gate_hot"] == [m.config.n_ff] * m.config.n_layer
    text = cli("plan", "-m", path, "--memory-budget", budget, "-c", "64", "--io", "pread", "--npu", "off",
               "--predictor")
    assert text.code == 0 and "gate rows" in text.out and "streamed with the predictor" in text.out, text.err
    assert "(mapped: attention, norms, embeddings, output, predictor" in text.out
    low = cli("plan", "-m", path, "--memory-budget", "1M", "-c", "64", "--predictor")
    assert low.code != 0 and "below the minimum of" in low.err and "Traceback" not in low.err
    assert len([ln for ln in low.err.splitlines() if ln.startswith("pi2: ")]) == 1
    base = cli("run", path, "-p", "hello", "-n", "6", "--temp", "0", "--json", "-c", "64", "--predictor")
    res = cli("run", path, "-p", "hello", "-n", "6", "--temp", "0", "--json", "-c", "64", "--predictor",
              "--memory-budget", budget, "--io", "pread", "--verbose", "--npu", "off")
    assert base.code == res.code == 0, res.err
    assert json.loads(res.out)["tokens"] == json.loads(base.out)["tokens"]
    assert "pi2: cache: gate rows" in res.err
    bench = cli("bench", path, "-p", "4", "-n", "4", "-r", "1", "-o", "json", "--memory-budget", budget, "--io",
                "pread", "--predictor", "--npu", "off", timeout=120)
    assert bench.code == 0, bench.err
    tg = [r for r in json.loads(bench.out) if r["n_gen"] == 4][0]
    assert 0 <= tg["pi2_gate_hit_rate"] <= 1 and tg["pi2_gate_flash_bytes_per_token"] >= 0
    assert tg["pi2_gate_cache_bytes"] > 0


@pytest.mark.model
@pytest.mark.slow
def test_smollm2_streamed_gate_equals_mapped():
    """~/.cache/pi2/conv/smollm2-lowbit.pi2.gguf (`pi2 convert --predictor lowbit`) when it is there: a tiny cache
    (cluster 16, a quarter of the gate rows hot, no bundle hot prefix) gives the mapped run's logits."""
    from pathlib import Path
    path = Path.home() / ".cache" / "pi2" / "conv" / "smollm2-lowbit.pi2.gguf"
    if not path.exists():
        pytest.skip("no converted SmolLM2 with a low-bit predictor (pi2 convert --predictor lowbit)")
    m = load_model(path)
    want = run(ctx_for(path, 2))
    c = ctx_for(path, 2, gate_stream(m, 16, 0, m.config.n_ff // 4))
    assert np.array_equal(run(c), want)
    st = c.cache_stats()
    assert st["gate_misses"] > 0 and st["gate_hot"] > 0 and st["misses"] > 0
