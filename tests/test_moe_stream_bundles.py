"""test_moe_stream_bundles.py — a converted MoE file's experts (`pi2 convert`: hot-first neurons in up/down bundles)
streamed from flash (csrc/cache/experts.c: a slot is the expert's gate span and its bundle span; csrc/pipeline/
experts.c reads them; csrc/ffn/moe_stream.c and moe_down_rows.c compute from the slot): logits bit-identical to the
in-memory run of the same converted file for every slot count (one slot: an eviction for every expert of every
token), resident hot experts, read backends, 1 and 2 threads, prompt batches and single tokens, the dense and relu
rules, Q4_0 experts with I8 and Q4_1 down rows and F32 experts; the open-cluster counts equal the in-memory run's;
the CLI streams a converted file within --memory-budget (same text as in memory) and `pi2 plan` prints its split.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from clirun import cli
from moe_files import write_moe

from pi2.convert import convert
from pi2.engine import CContext, CModel, expert_clusters, flash_io
from pi2.model.loader import load_model
from pi2.plan import experts as plan_experts
from pi2.runtime.ffn_rule import FFNRule

PROMPT = [3, 17, 42, 99, 7, 256, 300, 11, 64, 128, 5, 77, 200, 401, 33, 9, 150, 18, 260, 71]
NEXT = [5, 9, 300, 41, 12, 88]
_files: dict = {}


def close_gates(a):
    """Zero 70 % of every expert's gate rows (fixed by the seed): most neurons closed, as in a trained ReLU model."""
    a = np.array(a, copy=True)
    a[:, np.random.default_rng(3).random(a.shape[1]) < 0.7, :] = 0
    return a


CLOSED = {f"blk.{il}.ffn_gate_exps.weight": close_gates for il in range(3)}


def converted(tmp_path_factory, exp_type: str, ffn_type: str = "auto", closed: bool = False):
    """(converted model, its CModel) of the synthetic smallthinker file with exp_type experts."""
    key = (exp_type, ffn_type, closed)
    if key not in _files:
        d = tmp_path_factory.mktemp("moebundles")
        src = write_moe(d / f"st.{exp_type}.gguf", "smallthinker", "F32", exp_type=exp_type,
                        alter=CLOSED if closed else None)
        rep = convert(src, d / "st.pi2.gguf", calib_tokens=256, progress=False, n_threads=2, ffn_type=ffn_type)
        m = load_model(rep.output)
        _files[key] = (m, CModel.from_model(m))
    return _files[key]


def run(c) -> list:
    """The prompt's logits (every row), then single tokens' (the same context)."""
    return [c.decode(PROMPT, all_logits=True)] + [c.decode([t]) for t in NEXT]


def backends(path) -> list:
    res = flash_io.probe(path)
    return ["pread", "aio", "mmap"] + (["uring"] if res.verdict("uring").usable else [])


@pytest.mark.parametrize("exp_type,ffn_type,closed", [("Q4_0", "auto", False), ("Q4_0", "auto", True),
                                                       ("F32", "auto", False), ("Q4_0", "q4_1", True)])
def test_streamed_bundles_equal_in_memory(tmp_path_factory, exp_type, ffn_type, closed):
    m, cm = converted(tmp_path_factory, exp_type, ffn_type, closed)
    X, k, L = m.config.n_expert, m.config.n_expert_used, m.config.n_layer
    rng = np.random.default_rng(5)
    hot = rng.random((L, X)) < 0.3
    ios = backends(m.path)
    cases = [  # (cold slots, hot experts, backend, threads)
        (1, None, "pread", 2),            # one slot: every expert of every token evicts the one before
        (k, None, ios[-1], 1),            # a token's experts fit; a batch's come in chunks
        (k + 1, hot, "aio", 2),           # resident experts + a small LRU
        (L * X, None, "mmap", 1),         # every expert fits: misses only the first time
    ]
    read = {}
    for rule in ("dense", "relu"):
        ref = CContext(cm, 64, 1)
        ref.set_ffn(FFNRule(rule))
        want = run(ref)
        for slots, h, io, threads in cases:
            c = CContext(cm, 64, threads)
            c.set_ffn(FFNRule(rule))
            c.set_stream(cluster=8, n_slots=0, io=io, n_expert_slots=slots, expert_hot=h,
                         expert_ahead=slots >= 2 * k)
            got = run(c)
            for i, (a, b) in enumerate(zip(want, got)):
                assert np.array_equal(a, b), f"{exp_type} {rule}: {slots} slots, {io}, -t {threads}: step {i} differs"
            st = c.cache_stats()
            read[rule, slots] = st["bytes_read"]
            assert st["tokens"] == len(PROMPT) + len(NEXT)
            assert st["expert_hot"] + st["expert_hits"] + st["expert_misses"] >= len(NEXT) * k * L
            if rule == "dense":   # every miss: the gate rows' span and the bundles' span
                assert st["reads"] == 2 * st["expert_misses"]
            else:                 # a single token's: the gate rows, then reads of the clusters it lacks
                assert st["reads"] > 2 * st["expert_misses"] - len(NEXT) * k * L
            if slots == 1:
                assert st["expert_hits"] == 0 and st["expert_misses"] >= (len(PROMPT) // 8 + len(NEXT)) * k * L
            if h is not None:
                assert st["expert_hot"] > 0
            assert expert_clusters.stats(c) == expert_clusters.stats(ref)   # the open clusters, counted the same
    if closed:   # most clusters closed: a single token's misses read far less in two phases
        assert read["relu", 1] < 0.9 * read["dense", 1]


def test_slot_is_gate_and_bundle_spans(tmp_path_factory):
    """The planner's slot and read sizes are the C cache's: the gate span plus the bundle span, 4 KiB-aligned."""
    m, cm = converted(tmp_path_factory, "Q4_0")
    c = CContext(cm, 64, 1)
    c.set_stream(cluster=8, n_slots=0, io="pread", n_expert_slots=3)
    c.decode([5])
    st = c.cache_stats()
    assert st["arena_bytes"] == 3 * plan_experts.slot_bytes(m)
    cfg, lay = m.config, [b for b in plan_experts.expert_layers(m) if b]
    t = m.file.tensors
    assert lay[0] == (t["blk.0.ffn_gate_exps.weight"].nbytes // cfg.n_expert,
                      t["blk.0.ffn_bundle_exps.weight"].nbytes // cfg.n_expert, 0)
    per_miss = plan_experts.read_bytes(m)[0]
    assert st["bytes_read"] <= st["expert_misses"] * per_miss and st["bytes_read"] >= st["expert_misses"] * sum(lay[0])
    opened = plan_experts.open_read_bytes(m)
    assert all(lay[0][0] < o < per_miss for o in opened)


def test_cli_streams_a_converted_file(tmp_path_factory, monkeypatch):
    monkeypatch.setattr(plan_experts, "runtime_bounds", lambda model: (96 << 20, 96 << 20))
    m, cm = converted(tmp_path_factory, "Q4_0", closed=True)
    args = (m.path, "-p", "hello world", "-n", "12", "--temp", "0", "-c", "128", "-t", "2", "--ignore-eos")
    mapped = cli("run", *args)
    assert mapped.code == 0, mapped.err
    plan = cli("plan", m.path, "-c", "128", "--memory-budget", "1G", "--json")
    assert plan.code == 0, plan.err
    p = json.loads(plan.out)
    assert p["slot_bytes"] == plan_experts.slot_bytes(m) and p["two_phase"]   # relu, the default rule
    assert p["whole_miss_bytes"] == plan_experts.read_bytes(m)[0] > p["miss_bytes"] > 0
    budget = f"{(p['floor'] >> 20) + 1}M"    # just above the floor: a few slots, many misses
    streamed = cli("run", *args, "--memory-budget", budget, "--verbose")
    assert streamed.code == 0, streamed.err
    assert streamed.out == mapped.out
    assert "pi2: experts:" in streamed.err and "hit rate" in streamed.err
    assert "slots sized to what is read" in streamed.err and "clusters found" in streamed.err
    text = cli("plan", m.path, "-c", "128", "--memory-budget", budget)
    assert text.code == 0 and "expert cache" in text.out and "flash per token" in text.out, text.err
    assert "gate rows, then the clusters with an open neuron" in text.out
    bench = cli("bench", m.path, "-p", "0", "-n", "4", "-r", "1", "-t", "1", "-o", "json", "--memory-budget", budget)
    assert bench.code == 0, bench.err
    b = json.loads(bench.out)[0]
    assert b["pi2_flash_bytes_per_token"] > 0 and 0 <= b["pi2_expert_hit_rate"] <= 1
    assert 0 < b["pi2_expert_bytes_per_token_open_clusters"] < b["pi2_expert_bytes_per_token_whole"]
    assert 0 <= b["pi2_expert_partial_hit_rate"] <= b["pi2_expert_hit_rate"] and 0 <= b["pi2_cluster_hit_rate"] <= 1
    assert 0 < b["pi2_expert_held_bytes"] <= b["pi2_cache_bytes"] + 4 * plan_experts.slot_bytes(m)


@pytest.mark.parametrize("closed", [False, True])
def test_slots_sized_to_what_is_read_equal_in_memory(tmp_path_factory, closed):
    """A cap on the cold slots' bytes (slots hold only what was read into them, the least recently used experts
    dropped): the same logits as in memory for caps from one 4 KiB page (every expert dropped as soon as it is used)
    to every expert, each backend, -t 1/2, both rules, with and without the leading clusters read with the gate rows;
    the slots hold at most the cap but for one step's experts."""
    m, cm = converted(tmp_path_factory, "Q4_0", closed=closed)
    X, k, L = m.config.n_expert, m.config.n_expert_used, m.config.n_layer
    slot = plan_experts.slot_bytes(m)
    ios = backends(m.path)
    pre = plan_experts.pre_clusters(m)
    assert pre.shape == (L, X) and (pre >= 0).all()
    cases = [(4096, "pread", 2), (slot + 4096, ios[-1], 1), (3 * k * slot // 2, "aio", 2), (L * X * slot, "mmap", 1),
             (2 * k * slot, "uring" if "uring" in ios else "pread", 1)]
    cases += [(cap, io, 3 - t, pre) for cap, io, t in cases]
    for rule in ("dense", "relu"):
        ref = CContext(cm, 64, 1)
        ref.set_ffn(FFNRule(rule))
        want = run(ref)
        for cap, io, threads, *lead in cases:
            c = CContext(cm, 64, threads)
            c.set_ffn(FFNRule(rule))
            c.set_stream(cluster=8, n_slots=0, io=io, n_expert_slots=L * X, expert_cold_bytes=cap,
                         expert_ahead=cap >= 2 * k * slot, expert_pre=lead[0] if lead else None)
            got = run(c)
            for i, (a, b) in enumerate(zip(want, got)):
                assert np.array_equal(a, b), f"{rule}: cap {cap}, {io}, -t {threads}: step {i} differs"
            st = c.cache_stats()
            assert st["expert_held_bytes"] <= max(cap, 0) + k * slot, (rule, cap, st["expert_held_bytes"])
            if cap == 4096:
                assert st["expert_evicted"] > 0 and st["expert_slots_held"] <= k
            if cap >= L * X * slot:
                assert st["expert_evicted"] == 0
            assert 0 <= st["expert_cl_found"] <= st["expert_cl_need"]
            assert st["expert_partial_hits"] <= st["expert_hits"]
            assert expert_clusters.stats(c) == expert_clusters.stats(ref)


def test_slots_hold_more_experts_than_whole_slots_fit(tmp_path_factory):
    """The point of sizing slots to what is read: at the bytes of n whole slots, a converted file's single tokens
    under the relu rule (gate rows, then only the open clusters) keep more than n experts resident and find more of
    them than n whole slots do. Fails if slots go back to whole-expert size."""
    m, cm = converted(tmp_path_factory, "Q4_0", closed=True)
    X, k, L = m.config.n_expert, m.config.n_expert_used, m.config.n_layer
    slot, n = plan_experts.slot_bytes(m), 3 * k
    toks = list(range(1, 60))
    res = {}
    for capped in (False, True):
        c = CContext(cm, 128, 2)
        c.set_ffn(FFNRule("relu"))
        c.set_stream(cluster=8, n_slots=0, io="pread", n_expert_slots=L * X if capped else n,
                     expert_cold_bytes=n * slot if capped else 0)
        c.decode([3])
        for t in toks:
            c.decode([t])
        res[capped] = c.cache_stats()
    held, whole = res[True], res[False]
    assert held["expert_held_bytes"] <= n * slot + k * slot
    assert held["expert_slots_held"] > n >= whole["expert_slots_held"]
    assert held["expert_hits"] > whole["expert_hits"]
    assert held["expert_cl_found"] > whole["expert_cl_found"]


def test_plan_sizes_slots_to_what_is_read(tmp_path_factory, monkeypatch):
    """`pi2 plan --json` on a converted file under the relu rule: a byte cap on the slots, more experts expected in
    it than whole slots fit, and the expected hit rate from them; under --dense (whole reads) whole slots."""
    monkeypatch.setattr(plan_experts, "runtime_bounds", lambda model: (96 << 20, 96 << 20))
    m, cm = converted(tmp_path_factory, "Q4_0", closed=True)
    p = json.loads(cli("plan", m.path, "-c", "128", "--memory-budget", "1G", "--json").out)
    floor = p["floor"]
    budget = f"{(floor + 8 * p['slot_bytes']) >> 20}M"
    p = json.loads(cli("plan", m.path, "-c", "128", "--memory-budget", budget, "--json").out)
    assert p["two_phase"] and p["cap"] > 0 and p["cold_bytes"] == p["cap"]
    assert p["n_effective"] > p["cap"] // p["slot_bytes"] and p["held_each"] < p["slot_bytes"]
    assert p["n_slots"] >= p["n_effective"]
    text = cli("plan", m.path, "-c", "128", "--memory-budget", budget).out
    assert "slots sized to what is read" in text


def test_leading_clusters_read_with_the_gate_rows(tmp_path_factory):
    """`pre_clusters` (hot-first clusters most tokens open) read with a miss's gate rows: the second phase then finds
    most of its open clusters in the slot (the cluster hit rate rises) and reads fewer times, same logits."""
    m, cm = converted(tmp_path_factory, "Q4_0", closed=True)
    X, k, L = m.config.n_expert, m.config.n_expert_used, m.config.n_layer
    pre = plan_experts.pre_clusters(m)
    assert pre.any()
    res, logits = {}, {}
    for lead in (None, pre):
        c = CContext(cm, 64, 1)
        c.set_ffn(FFNRule("relu"))
        c.set_stream(cluster=8, n_slots=0, io="pread", n_expert_slots=1, expert_pre=lead)   # a miss every time
        c.decode([3])
        logits[lead is None] = [c.decode([t]) for t in NEXT]
        res[lead is None] = c.cache_stats()
    assert all(np.array_equal(a, b) for a, b in zip(logits[True], logits[False]))
    assert res[False]["expert_cl_found"] > res[True]["expert_cl_found"] == 0


def test_capped_slots_evict_the_least_routed_expert(tmp_path_factory):
    """Under a cap, the pages that go are those of the least routed expert (decayed counts), not the least recently
    used one's: on tokens drawn from a skewed distribution the cache hits more often than a plain LRU of as many
    experts as it held at most (a simulation on the same routing, which the LRU engine matched exactly), same logits
    as in memory. Fails if eviction goes back to recency alone."""
    m, cm = converted(tmp_path_factory, "Q4_0", closed=True)
    X, k, L = m.config.n_expert, m.config.n_expert_used, m.config.n_layer
    slot = plan_experts.slot_bytes(m)
    ids = [int(t) % 500 for t in np.random.default_rng(5).zipf(1.3, 120)]
    ref = CContext(cm, 256, 2)
    ref.set_ffn(FFNRule("relu"))
    want = [ref.decode([t]) for t in ids]
    c = CContext(cm, 256, 2)
    c.set_ffn(FFNRule("relu"))
    c.set_stream(cluster=8, n_slots=0, io="pread", n_expert_slots=L * X, expert_cold_bytes=4 * slot)
    prev, routes, most = c.expert_counts.copy(), [], 0
    for i, t in enumerate(ids):
        assert np.array_equal(c.decode([t]), want[i]), f"token {i} differs"
        cur = c.expert_counts.copy()
        routes.append([(il, int(e)) for il in range(L) for e in np.nonzero(cur[il] - prev[il])[0]])
        prev = cur
        most = max(most, c.cache_stats()["expert_slots_held"])
    lru, lru_hits = {}, 0   # insertion-ordered dict: the least recently used first
    for step in routes:
        for key in step:
            lru_hits += key in lru
            lru.pop(key, None)
            lru[key] = 1
            while len(lru) > most:
                del lru[next(iter(lru))]
    st = c.cache_stats()
    assert st["expert_hits"] + st["expert_misses"] == len(ids) * L * k
    assert st["expert_hits"] > 1.5 * lru_hits + 20, (st["expert_hits"], lru_hits, most)
