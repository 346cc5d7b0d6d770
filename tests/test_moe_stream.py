"""test_moe_stream.py — a plain MoE GGUF's experts streamed from flash (csrc/cache/experts.c, csrc/pipeline/experts.c,
csrc/ffn/moe_stream.c): a context reading each routed expert's gate/up/down slices into expert slots (an LRU shared
by all layers, plus resident hot experts) gives logits bit-identical to the mapped run, for every architecture of
tests/moe_files.py in F32 and Q4_K_M, prompt batches and single tokens, tiny caches that force misses (one slot:
every layer's experts computed one chunk at a time) and big ones, every read backend and 1 and 2 threads; its
statistics add up (smallthinker's routing ahead reads the routed experts, sigmoid ties included); bad settings and
failing reads are refused with a message; the CLI streams a MoE file within --memory-budget (same text as the mapped
run), `pi2 plan` prints the split and refuses a budget below the floor.
"""
from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
from clirun import assert_error, cli
from moe_files import ARCHS, SPECS, loaded_moe, write_moe

from pi2.engine import CContext, CModel, flash_io
from pi2.errors import EngineError, UnsupportedError
from pi2.model.loader import load_model

PROMPT = [3, 17, 42, 99, 7, 256, 300, 11, 64, 128, 5, 77, 200, 401, 33, 9, 150, 18, 260, 71]
NEXT = [5, 9, 300, 41]
MOE_ARCHS = [a for a in ARCHS if SPECS[a]["n_expert"]]
_files: dict = {}


def loaded(tmp_path_factory, arch, wtype):
    return loaded_moe(tmp_path_factory, _files, arch, wtype)


def run(c) -> list:
    """The prompt's logits (every row), then single tokens' (the same context)."""
    return [c.decode(PROMPT, all_logits=True)] + [c.decode([t]) for t in NEXT]


def backends(path) -> list:
    res = flash_io.probe(path)
    return ["pread", "aio", "mmap"] + (["uring"] if res.verdict("uring").usable else [])


@pytest.mark.parametrize("wtype", ["F32", "Q4_K_M"])
@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_streamed_experts_equal_mapped(tmp_path_factory, arch, wtype):
    path, m, cm = loaded(tmp_path_factory, arch, wtype)
    X, k, L = m.config.n_expert, m.config.n_expert_used, m.config.n_layer
    want = run(CContext(cm, 256, 1))
    rng = np.random.default_rng(7)
    hot = rng.random((L, X)) < 0.3
    ios = backends(path)
    cases = [  # (cold slots, hot experts, backend, threads)
        (1, None, "pread", 2),            # one slot: each layer's experts one at a time, always a miss
        (k, None, ios[-1], 1),            # a token's experts fit; a batch's come in chunks
        (k + 1, hot, "aio", 2),           # resident experts + a small LRU
        (L * X, None, "mmap", 1),         # every expert fits: misses only the first time
    ]
    for slots, h, io, threads in cases:
        c = CContext(cm, 256, threads)
        c.set_stream(cluster=8, n_slots=0, io=io, n_expert_slots=slots, expert_hot=h)
        got = run(c)
        for i, (a, b) in enumerate(zip(want, got)):
            assert np.array_equal(a, b), f"{arch} {wtype}: {slots} slots, {io}, -t {threads}: step {i} differs"
        st = c.cache_stats()
        need = st["expert_hot"] + st["expert_hits"] + st["expert_misses"]
        assert st["tokens"] == len(PROMPT) + len(NEXT) and need >= len(NEXT) * k * L
        assert st["expert_rows"] == (len(PROMPT) + len(NEXT)) * k * L   # every row keeps its logits
        assert st["reads"] == 3 * st["expert_misses"] and st["bytes_read"] >= st["expert_misses"] * 3 * 4096
        if h is None:
            assert st["expert_hot"] == 0
        else:
            assert st["expert_hot"] > 0 and st["hot_bytes"] == int(h.sum()) * (st["arena_bytes"] // (int(h.sum()) + slots))
        if slots == 1:
            assert st["expert_hits"] == 0
        if slots == L * X:
            assert st["expert_misses"] <= L * X


@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_routing_ahead_equals_mapped(tmp_path_factory, arch):
    """Routing ahead (single tokens: layer il+1's router on layer il's output; smallthinker's early router) reads
    guessed experts before their layer routes: the logits stay the mapped run's, guesses the routing then needs are
    counted, and smallthinker's guesses are its routing itself."""
    path, m, cm = loaded(tmp_path_factory, arch, "Q4_K_M")
    k = m.config.n_expert_used
    ref = CContext(cm, 256, 2)
    want = [ref.decode([t]) for t in PROMPT]
    for slots, io in ((2 * k, "pread"), (4 * k, "aio")):
        c = CContext(cm, 256, 2)
        c.set_stream(cluster=8, n_slots=0, io=io, n_expert_slots=slots, expert_ahead=True)
        got = [c.decode([t]) for t in PROMPT]
        assert all(np.array_equal(a, b) for a, b in zip(want, got)), f"{arch}: {slots} slots, {io}"
        st = c.cache_stats()
        assert 0 < st["expert_ahead_used"] <= st["expert_ahead"] <= st["expert_misses"] + st["expert_hits"]
        if arch == "smallthinker":
            assert st["expert_ahead_used"] == st["expert_ahead"]
        st2 = c.stream_stats()
        assert 0 < st2["expert_ahead_hit_rate"] <= 1
    c.set_stream(cluster=8, n_slots=0, io="pread", n_expert_slots=k, expert_ahead=True)   # 2k > slots: none
    c.reset()
    assert np.array_equal(c.decode([PROMPT[0]]), want[0]) and c.cache_stats()["expert_ahead"] == 0


def test_routing_ahead_breaks_sigmoid_ties_as_routing(tmp_path):
    """smallthinker's router scaled up so sigmoid gating rounds many probabilities to 1.0f: routing breaks those ties
    by its sort, and the experts read ahead (its early router's) are the routed ones, every one of them (the k
    largest logits were not: a miss's bytes each), with the mapped run's logits."""
    L = SPECS["smallthinker"]["n_layer"]
    big = {f"blk.{il}.ffn_gate_inp.weight": (lambda a: a * 400.0) for il in range(L)}
    path = write_moe(tmp_path / "st.gguf", "smallthinker", "F32", alter=big)
    cm = CModel.from_model(load_model(path))
    k = SPECS["smallthinker"]["k"]
    ref = CContext(cm, 256, 2)
    want = [ref.decode([t]) for t in PROMPT]
    c = CContext(cm, 256, 2)
    c.set_stream(cluster=8, n_slots=0, io="pread", n_expert_slots=2 * k, expert_ahead=True)
    got = [c.decode([t]) for t in PROMPT]
    assert all(np.array_equal(a, b) for a, b in zip(want, got))
    st = c.cache_stats()
    assert st["expert_ahead"] > 0 and st["expert_ahead_used"] == st["expert_ahead"], st   # top-k logits: 85 of 180


@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_learned_hot_experts_equal_mapped(tmp_path_factory, arch):
    """Hot experts learned while running (cache/experts_learn.c: the cold slots of the most routed experts pinned):
    logits stay the mapped run's for small and large caches, with and without resident experts and routing ahead,
    -t 1 and 2; the pinned slots leave 2·k slots to the LRU and count among the hits."""
    path, m, cm = loaded(tmp_path_factory, arch, "Q4_K_M")
    X, k, L = m.config.n_expert, m.config.n_expert_used, m.config.n_layer
    ref = CContext(cm, 256, 1)
    want = run(ref) + [ref.decode([t]) for t in PROMPT]
    hot = np.random.default_rng(3).random((L, X)) < 0.2
    for slots, h, ahead, threads in ((2 * k + 1, None, False, 2), (L * X // 2, None, True, 1),
                                     (L * X // 2, hot, True, 2), (3 * k, None, True, 2)):
        c = CContext(cm, 256, threads)
        c.set_stream(cluster=8, n_slots=0, io="pread", n_expert_slots=slots, expert_hot=h, expert_ahead=ahead,
                     expert_learn=True)
        got = run(c) + [c.decode([t]) for t in PROMPT]
        for i, (a, b) in enumerate(zip(want, got)):
            assert np.array_equal(a, b), f"{arch}: {slots} slots, ahead {ahead}, -t {threads}: step {i} differs"
        st = c.cache_stats()
        assert 0 < st["expert_pinned"] <= slots - 2 * k
        assert 0 < st["expert_pinned_hits"] <= st["expert_hits"]
        assert c.stream_stats()["experts_learned"] == st["expert_pinned"]


def test_learning_keeps_more_of_the_routed_experts(tmp_path_factory):
    """On a file whose routing favours some experts, a cache of a third of the experts hits more often with
    learned hot experts than as a plain LRU shared by all layers (which forgets an expert before it comes back)."""
    path, m, cm = loaded(tmp_path_factory, "olmoe", "Q4_K_M")
    X, L = m.config.n_expert, m.config.n_layer
    ids = (PROMPT + NEXT) * 4
    rates = {}
    for learn in (False, True):
        c = CContext(cm, 256, 2)
        c.set_stream(cluster=8, n_slots=0, io="pread", n_expert_slots=L * X // 3, expert_learn=learn)
        for t in ids:
            c.decode([t])
        st = c.cache_stats()
        rates[learn] = st["expert_hits"] / (st["expert_hits"] + st["expert_misses"])
    assert rates[True] > rates[False] + 0.05, rates


def test_decode_after_reset_and_slot_reuse(tmp_path_factory):
    """A context whose cache is warm (hits) gives the same logits again after reset."""
    path, m, cm = loaded(tmp_path_factory, "qwen2moe", "Q4_K_M")
    want = run(CContext(cm, 256, 2))
    c = CContext(cm, 256, 2)
    c.set_stream(cluster=8, n_slots=0, io="pread", n_expert_slots=m.config.n_layer * m.config.n_expert)
    run(c)
    c.reset()
    got = run(c)
    assert all(np.array_equal(a, b) for a, b in zip(want, got))
    assert c.cache_stats()["expert_hits"] > 0


def test_refusals(tmp_path_factory, tmp_path):
    path, m, cm = loaded(tmp_path_factory, "olmoe", "F32")
    c = CContext(cm, 256, 1)
    with pytest.raises(EngineError, match="expert slots"):
        c.set_stream(cluster=8, n_slots=0, io="pread", n_expert_slots=0)
    dense = write_moe(tmp_path / "qwen3.F32.gguf", "qwen3", "F32")
    cd = CContext(CModel.from_model(load_model(dense)), 256, 1)
    with pytest.raises(UnsupportedError, match="no experts"):
        cd.set_stream(cluster=8, n_slots=0, io="pread", n_expert_slots=4)


def test_failing_read_is_an_error_then_recovers(tmp_path_factory, tmp_path):
    """Experts of a file cut short: an error naming the expert and layer, no hang; once the file is whole again
    the same context decodes what a mapped context does."""
    src, _m, _cm = loaded(tmp_path_factory, "llama", "F32")
    p = tmp_path / "cut.gguf"
    shutil.copy(src, p)
    whole = p.read_bytes()
    m = load_model(p)
    cm = CModel.from_model(m)
    ref = CContext(cm, 256, 1)
    want = ref.decode(PROMPT, all_logits=True)
    c = CContext(cm, 256, 2)
    c.set_stream(cluster=8, n_slots=0, io="pread", n_expert_slots=2)
    last = max(m.file.tensors.values(), key=lambda t: t.offset)     # the last layer's ffn_up_exps: nothing mapped after it
    assert last.name.endswith("ffn_up_exps.weight")
    os.truncate(p, last.offset + 4096)
    with pytest.raises(EngineError, match="expert"):
        c.decode(PROMPT)
    p.write_bytes(whole)
    c.reset()
    assert np.array_equal(c.decode(PROMPT, all_logits=True), want)


def fixed_runtime(monkeypatch):
    """The planner's runtime figure fixed (the test process's RSS drifts between in-process CLI calls)."""
    import pi2.plan.experts as experts
    monkeypatch.setattr(experts, "runtime_bounds", lambda model: (96 << 20, 96 << 20))


def test_cli_run_within_budget_equals_mapped(tmp_path_factory, monkeypatch):
    fixed_runtime(monkeypatch)
    path, m, cm = loaded(tmp_path_factory, "qwen3moe", "Q4_K_M")
    args = (str(path), "-p", "hello world", "-n", "12", "--temp", "0", "-c", "256", "-t", "2")
    mapped = cli("run", *args)
    assert mapped.code == 0, mapped.err
    plan = cli("plan", str(path), "-c", "256", "--memory-budget", "1G", "--json")
    assert plan.code == 0, plan.err
    floor = json.loads(plan.out)["floor"]
    budget = f"{(floor >> 20) + 1}M"    # just above the floor: a few slots, many misses
    streamed = cli("run", *args, "--memory-budget", budget, "--verbose")
    assert streamed.code == 0, streamed.err
    assert streamed.out == mapped.out
    assert "pi2: experts:" in streamed.err and "hit rate" in streamed.err
    text = cli("plan", str(path), "-c", "256", "--memory-budget", budget)
    assert text.code == 0 and "expert cache" in text.out and "flash per token" in text.out
    low = cli("plan", str(path), "-c", "256", "--memory-budget", "8M")
    assert_error(low, 2, "below what this model needs")


def test_profile_experts_makes_hot_experts(tmp_path_factory, tmp_path, monkeypatch):
    """`pi2 profile-experts` saves the routing counts; the plan then keeps the most routed experts resident and
    expects a higher hit rate; a run with them gives the mapped run's text."""
    monkeypatch.setenv("HOME", str(tmp_path))
    fixed_runtime(monkeypatch)
    path, m, cm = loaded(tmp_path_factory, "olmoe", "Q4_K_M")
    plan_args = ("plan", str(path), "-c", "256", "--memory-budget", "1G", "--json")
    floor = json.loads(cli(*plan_args).out)["floor"]
    budget = f"{(floor >> 20) + 2}M"
    res = cli("plan", str(path), "-c", "256", "--memory-budget", budget, "--json")
    assert res.code == 0, res.err
    before = json.loads(res.out)
    res = cli("profile-experts", str(path), "--calib-tokens", "256", "-t", "2")
    assert res.code == 0, res.err
    assert "saved" in res.out and list((tmp_path / ".cache" / "pi2" / "experts").glob("*.json"))
    after = json.loads(cli("plan", str(path), "-c", "256", "--memory-budget", budget, "--json").out)
    assert before["n_hot"] == 0 and not before["profiled"]
    assert after["profiled"] and after["n_hot"] > 0 and after["hit_rate"] > before["hit_rate"]
    assert after["n_slots"] >= 2 * after["k"]
    args = (str(path), "-p", "hello world", "-n", "10", "--temp", "0", "-c", "256")
    assert cli("run", *args, "--memory-budget", budget).out == cli("run", *args).out


def test_run_adds_its_routing_to_the_profile(tmp_path_factory, tmp_path, monkeypatch):
    """A run whose experts stream adds its routing to the file's routing profile (the next plan then keeps hot
    experts resident and its run gives the same text); a short run, --no-expert-profile and a profile that cannot
    be written leave the old profile whole (a note, not a traceback)."""
    import pi2.plan.expert_profile as experts
    monkeypatch.setenv("HOME", str(tmp_path))
    fixed_runtime(monkeypatch)
    path, m, cm = loaded(tmp_path_factory, "qwen2moe", "Q4_K_M")
    floor = json.loads(cli("plan", str(path), "-c", "256", "--memory-budget", "1G", "--json").out)["floor"]
    budget = f"{(floor >> 20) + 3}M"
    args = (str(path), "-p", "hello world", "--temp", "0", "-c", "256", "--ignore-eos", "--memory-budget", budget)
    prof = experts.profile_path(m)
    assert cli("run", *args, "-n", "8").code == 0 and not prof.exists()          # too short to say much
    assert cli("run", *args, "-n", "80", "--no-expert-profile").code == 0 and not prof.exists()
    first = cli("run", *args, "-n", "80")
    assert first.code == 0, first.err
    d = json.loads(prof.read_text())
    counts = np.array(d["expert_rows"])
    assert d["tokens"] >= experts.MIN_RUN_TOKENS and counts.shape == (m.config.n_layer, m.config.n_expert)
    assert counts.sum(axis=1).max() == d["tokens"] * m.config.n_expert_used   # the last layer: logits' rows only
    plan = json.loads(cli("plan", str(path), "-c", "256", "--memory-budget", budget, "--json").out)
    assert plan["profiled"] and plan["n_hot"] > 0
    second = cli("run", *args, "-n", "80")
    assert second.out == first.out
    assert json.loads(prof.read_text())["tokens"] == 2 * d["tokens"]            # added, not replaced
    kept = prof.read_bytes()

    def fail(*a, **kw):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(experts.os, "replace", fail)
    res = cli("run", *args, "-n", "80")
    assert res.code == 0 and "routing profile was not saved" in res.err and "Traceback" not in res.err
    assert prof.read_bytes() == kept and [p.name for p in prof.parent.iterdir()] == [prof.name]
