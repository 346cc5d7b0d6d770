"""test_npu_ffn.py — decode's hot prefix on NNAPI (csrc/nnapi/hot_ffn.c, pi2/plan/npu_plan.py, pi2/runtime/npu.py) against
the stand-in libneuralnetworks.so: results against the numpy specification (pi2.reference.sparse_ffn.SparseFFN.npu_hot: a
single token computes every neuron below H and the rule's active ones above), the CPU path unchanged when
nothing is attached, the run overlapping the CPU's work, every fallback (missing library, missing symbol,
compile, start and execution failures) giving the CPU's own result, the budget counting the copies, and
`--npu` on `pi2 plan`, `pi2 run` and `pi2 bench`.
Tolerance against the reference (logits and each layer's FFN output, NMSE):
  F32/F16 weights: <= 1e-5 (NMSE_F16): the graph rounds weights, input and every intermediate to F16;
  quantized weights: <= 5e-4 (NMSE_QUANT): the reference also rounds the FFN input to the weights' Q8
  activation blocks (relative error ~1/254 per value), which the graph's F16 input does not.
"""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

from clirun import cli
from fixtures import write_model
from pi2file import convert_pi2
from standin import libs, nmse, standin  # noqa: F401 (libs, standin: fixtures)
from pi2.engine import CContext, CModel
from pi2.engine.nnapi import NnapiDelegate, ctx_npu_ffn_stats, ctx_set_npu_ffn
from pi2.errors import EngineError
from pi2.model.loader import load_model
from pi2.plan import npu_plan
from pi2.reference.forward import ReferenceContext
from pi2.runtime.config import RunConfig
from pi2.runtime.session import open_session
from pi2.runtime import ffn_rule

NMSE_F16, NMSE_QUANT = 1e-5, 5e-4
PROMPT, SINGLE = [1, 5, 9, 200], [33, 7, 80, 90]


def budget() -> int:
    """A --memory-budget with 400 MiB above what this process holds now (the suite's earlier tests grow it)."""
    from pi2.plan.budget import runtime_rss
    return runtime_rss() + (400 << 20)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("npuffn")
    q8 = write_model(d / "q8.gguf", wtype="Q8_0", n_ff=256, n_embd=64, seed=3)
    f32 = write_model(d / "f32.gguf", wtype="F32", n_ff=256, n_embd=64, seed=5)
    relu = write_model(d / "relu.gguf", wtype="F16", n_ff=192, n_embd=64, seed=6, act="relu")
    return {"q8": convert_pi2(q8, d / "q8.pi2.gguf", down_type="Q8_0", default_keep=0.5),
            "f32": convert_pi2(f32, d / "f32.pi2.gguf", down_type="F32", default_keep=0.5),
            "relu": convert_pi2(relu, d / "relu.pi2.gguf", down_type="F16", default_keep=0.5),
            "plain": q8}


def c_ctx(path, threads=1):
    m = load_model(path)
    c = CContext(CModel.from_model(m), 32, threads)
    c.set_ffn(ffn_rule.choose_rule(m, None, False, use_predictor=False))
    return m, c


def run(ctx, trace=None) -> np.ndarray:
    """A prompt batch (the CPU's), then single tokens (the hot prefix's): logits of every token."""
    out = [ctx.decode(PROMPT, all_logits=True)]
    out += [ctx.decode([t], all_logits=True) for t in SINGLE]
    return np.concatenate(out)


def cpu_logits(path, threads=1) -> np.ndarray:
    return run(c_ctx(path, threads)[1])


# ---- the C engine against the specification ---------------------------------------------------------

@pytest.mark.parametrize("name, hot, tol", [("f32", [64, 192], NMSE_F16), ("relu", [192, 64], NMSE_F16),
                                            ("q8", [128, 256], NMSE_QUANT), ("q8", [0, 64], NMSE_QUANT)])
def test_hot_prefix_matches_the_reference(standin, files, name, hot, tol):
    m, c = c_ctx(files[name])
    ctx_set_npu_ffn(c, NnapiDelegate(standin.path), hot)
    got_ffn, ref_ffn = [], []
    c.set_trace(lambda n, il, a: got_ffn.append(a) if n == "ffn_out" and il == 0 else None)
    got = run(c)
    ref = ReferenceContext(m, 32)
    ref.ffn.npu_hot = hot
    ref.trace = lambda n, il, a: ref_ffn.append(a) if n == "ffn_out" and il == 0 else None
    want = run(ref)
    cpu = cpu_logits(files[name])
    assert np.array_equal(got[:len(PROMPT)], cpu[:len(PROMPT)])           # prompt batches: the CPU's, exactly
    assert nmse(got, want) <= tol
    assert nmse(got_ffn[1], ref_ffn[1]) <= tol                           # layer 0 of the first single token
    st = ctx_npu_ffn_stats(c)
    assert st["runs"] == len(SINGLE) * sum(h > 0 for h in hot) and st["fallbacks"] == 0
    graphs = standin.graphs()
    assert len(graphs) == sum(h > 0 for h in hot)                        # compiled once per layer, batch 1
    assert all(g["operands"][0]["dims"] == [1, m.config.n_embd] for g in graphs)
    assert st["bytes"] == npu_plan.copy_bytes(m.config.n_embd, m.config.n_ff, hot)   # what the budget counts
    # the graph did the hot part: the CPU-only result is further from this specification
    if name != "relu":
        assert nmse(cpu, want) > 10 * nmse(got, want)


def test_same_result_for_any_thread_count(standin, files):
    outs = []
    for threads in (1, 3):
        _, c = c_ctx(files["q8"], threads)
        ctx_set_npu_ffn(c, NnapiDelegate(standin.path), [128, 64])
        outs.append(run(c))
    assert np.array_equal(outs[0], outs[1])


def test_nothing_attached_is_the_cpu_path(standin, files):
    want = cpu_logits(files["q8"])
    _, c = c_ctx(files["q8"])
    d = NnapiDelegate(standin.path)
    ctx_set_npu_ffn(c, d, [64, 64])
    ctx_set_npu_ffn(c, None)                                             # detached
    assert np.array_equal(run(c), want)
    _, z = c_ctx(files["q8"])
    ctx_set_npu_ffn(z, d, [0, 0])                                        # no layer handed over
    assert np.array_equal(run(z), want) and standin.executions() == 0
    assert np.array_equal(run(open_session(load_model(files["q8"]), RunConfig(n_ctx=32, n_threads=1, npu="off"))),
                          want)


def test_bad_hot_counts(standin, files):
    _, c = c_ctx(files["q8"])
    d = NnapiDelegate(standin.path)
    with pytest.raises(EngineError, match="outside 0..256"):
        ctx_set_npu_ffn(c, d, [64, 257])
    _, p = c_ctx(files["plain"])
    with pytest.raises(EngineError, match="no FFN down rows"):
        ctx_set_npu_ffn(p, d, [64, 64])
    with pytest.raises(ValueError, match="one count per layer"):
        ctx_set_npu_ffn(c, d, [64])


def test_the_cpu_works_while_the_graph_runs(standin, files):
    """The graph starts before the gate rows and is waited for after the cold neurons: at the "ffn_gate"
    checkpoint (CPU work after the start) the run has not finished."""
    _, c = c_ctx(files["q8"])
    ctx_set_npu_ffn(c, NnapiDelegate(standin.path), [128, 128])
    run(c)                                                               # compiled
    standin.set(delay_ms=100)
    seen = []
    c.set_trace(lambda n, il, a: seen.append((il, standin.executions())) if n == "ffn_gate" else None)
    before = standin.executions()
    c.decode([11])
    assert seen == [(0, before), (1, before + 1)]                       # each layer's run pending at its gate
    assert standin.executions() == before + 2


# ---- fallbacks: the CPU's own result ----------------------------------------------------------------

@pytest.mark.parametrize("fail, phase", [("fail_compile", "compiling"), ("unsupported", "do not support"),
                                         ("fail_start", "starting"), ("fail_execute", "running")])
def test_each_failure_is_the_cpu_result_once(standin, files, fail, phase):
    want = cpu_logits(files["q8"])
    standin.set(**{fail: 1})
    d = NnapiDelegate(standin.path)
    _, c = c_ctx(files["q8"])
    ctx_set_npu_ffn(c, d, [128, 64])
    assert np.array_equal(run(c), want)
    notes = [n for n in d.notes() if phase in n and "hot FFN" in n]
    assert len(notes) == 2 and len(d.notes()) == 2, d.notes()           # one per layer's graph
    seen = (len(standin.graphs()), standin.executions())
    standin.set(**{fail: 0})
    c.reset()
    assert np.array_equal(run(c), want)                                 # not tried again
    assert (len(standin.graphs()), standin.executions()) == seen
    st = ctx_npu_ffn_stats(c)
    assert st["runs"] == 0 and st["fallbacks"] == 2 * 2 * len(SINGLE)


def test_execution_failure_in_a_streamed_run(standin, files):
    m = load_model(files["q8"])
    cfg = dict(n_ctx=32, n_threads=1, memory_budget=budget(), io="pread", npu_gbps=1e6)
    want = run(open_session(m, RunConfig(npu="off", **cfg)))
    standin.set(fail_execute=1)
    ctx = open_session(m, RunConfig(npu="nnapi", nnapi_lib=standin.path, **cfg))
    assert ctx.npu.state == "nnapi"
    assert np.array_equal(run(ctx), want)


@pytest.mark.parametrize("lib", ["missing", "no_wait"])
def test_no_library_or_symbol_is_a_cpu_run(libs, files, lib, capsys):
    path = "/nonexistent/libneuralnetworks.so" if lib == "missing" else libs["no_wait"]
    m = load_model(files["q8"])
    want = cpu_logits(files["q8"])
    auto = open_session(m, RunConfig(n_ctx=32, n_threads=1, npu="auto", nnapi_lib=path))
    assert np.array_equal(run(auto), want) and auto.npu.state == "off" and capsys.readouterr().err == ""
    forced = open_session(m, RunConfig(n_ctx=32, n_threads=1, npu="nnapi", nnapi_lib=path))
    assert np.array_equal(run(forced), want) and forced.npu.state == "off"
    why = "NNAPI unavailable" if lib == "missing" else "ANeuralNetworksEvent_wait"
    assert re.fullmatch(rf"pi2: note: --npu nnapi: .*{why}.*; running on the CPU\n", capsys.readouterr().err)


# ---- the decision, the budget and the CLI ---------------------------------------------------------

def plan_json(path, *args) -> dict:
    r = cli("plan", path, "--memory-budget", f"{budget() >> 20}M", "-c", "32", "-t", "1", "--io", "pread", "--json", *args)
    assert r.code == 0, r.err
    return json.loads(r.out)


def test_plan_reports_the_npu(standin, files):
    off = plan_json(files["q8"], "--npu", "off")
    assert off["npu"]["use"] is False and off["npu_bytes"] == 0
    on = plan_json(files["q8"], "--npu", "auto", "--nnapi-lib", standin.path, "--npu-gbps", "1e6")
    n = on["npu"]
    assert n["use"] is True and n["devices"] == "standin-npu" and n["npu_source"] == "--npu-gbps"
    assert n["n_hot"] == [256, 256]                                   # a free NPU takes every neuron
    assert n["bytes"] == npu_plan.copy_bytes(64, 256, [256, 256]) == on["npu_bytes"]
    assert on["fixed"] - off["fixed"] == n["bytes"]                   # counted in the fixed region, so in the floor
    assert n["gain"] > 1 and n["t_hybrid_ms"] < n["t_cpu_ms"]
    assert on["n_hot"] == [0, 0] and on["flash_bytes"] == 0           # the cache keeps no hot prefix of its own
    slow = plan_json(files["q8"], "--npu", "auto", "--nnapi-lib", standin.path, "--npu-gbps", "1e-6")["npu"]
    assert slow["use"] is False and "no layer is predicted to gain" in slow["reason"]
    forced = plan_json(files["q8"], "--npu", "nnapi", "--nnapi-lib", standin.path, "--npu-gbps", "1e-6")["npu"]
    assert forced["use"] is True and all(h > 0 for h in forced["n_hot"]) and forced["gain"] < 1
    measured = plan_json(files["q8"], "--npu", "nnapi", "--nnapi-lib", standin.path)["npu"]
    assert measured["npu_source"] == "measured on this delegate" and measured["npu_gbps"] > 0
    text = cli("plan", files["q8"], "--memory-budget", f"{budget() >> 20}M", "-c", "32", "--npu", "auto", "--nnapi-lib",
               standin.path, "--npu-gbps", "1e6")
    assert text.code == 0 and re.search(r"^npu +nnapi on standin-npu$", text.out, re.M)
    assert re.search(r"^npu predicted +FFN .* \(x[0-9.]+\); NPU 1000000\.00 GB/s \(--npu-gbps\)", text.out, re.M)
    assert re.search(r"^fixed region .*; NPU copies [0-9.]+ (MiB|KiB|bytes)\)$", text.out, re.M)


def test_auto_needs_an_accelerator(standin, files):
    standin.set(accelerator=0)
    n = plan_json(files["q8"], "--npu", "auto", "--nnapi-lib", standin.path, "--npu-gbps", "1e6")["npu"]
    assert n["use"] is False and "no GPU or accelerator" in n["reason"]
    n = plan_json(files["q8"], "--npu", "nnapi", "--nnapi-lib", standin.path, "--npu-gbps", "1e6")["npu"]
    assert n["use"] is True and n["devices"] == "nnapi-reference"
    n = plan_json(files["q8"], "--npu", "auto", "--nnapi-lib", "/nonexistent/libneuralnetworks.so")["npu"]
    assert n["use"] is False and "NNAPI unavailable" in n["reason"]


def test_copies_are_cut_to_the_room_left(standin, files):
    m = load_model(files["q8"])
    d = NnapiDelegate(standin.path)
    full = npu_plan.decide(m, "nnapi", d, "", 1, npu_gbps=1e6)
    room = npu_plan.copy_bytes(64, 256, [256, 128])
    cut = npu_plan.decide(m, "nnapi", d, "", 1, room=room, npu_gbps=1e6)
    assert full.n_hot == [256, 256] and cut.use and cut.bytes <= room and sum(cut.n_hot) == 384
    none = npu_plan.decide(m, "auto", d, "", 1, room=1000, npu_gbps=1e6)
    assert not none.use and "do not fit" in none.reason and none.n_hot == [0, 0]
    plain = npu_plan.decide(load_model(files["plain"]), "auto", d, "", 1)
    assert not plain.use and "needs a pi2 file" in plain.reason


def test_streamed_run_counts_the_copies(standin, files):
    m = load_model(files["q8"])
    cfg = dict(n_ctx=32, n_threads=1, memory_budget=budget(), io="pread", npu_gbps=1e6)
    off = open_session(m, RunConfig(npu="off", **cfg))
    on = open_session(m, RunConfig(npu="auto", nnapi_lib=standin.path, **cfg))
    assert on.npu.state == "nnapi" and off.npu.state == "off"
    assert on.cache.npu_bytes == on.npu.decision.bytes > 0 and on.cache.fixed - on.cache.npu_bytes == off.cache.fixed
    run(on)
    assert ctx_npu_ffn_stats(on.ctx)["bytes"] == on.cache.npu_bytes       # what the NPU holds once every graph ran
    ref = ReferenceContext(m, 32)
    ref.ffn.npu_hot = on.npu.decision.n_hot
    on.reset()
    assert nmse(run(on), run(ref)) <= NMSE_QUANT


def test_run_and_bench_take_the_plans_decision(standin, files):
    args = ["run", files["q8"], "-p", "one two three", "-n", "4", "--temp", "0", "--json", "-t", "1",
            "--nnapi-lib", standin.path]
    off = cli(*args, "--npu", "off")
    fast = cli(*args, "--npu-gbps", "1e6", "--verbose")
    slow = cli(*args, "--npu-gbps", "1e-6", "--verbose")
    assert off.code == fast.code == slow.code == 0, (fast.err, slow.err)
    assert standin.executions() > 0
    assert "pi2: npu: no layer is predicted to gain from the NPU" in slow.err
    assert json.loads(slow.out)["tokens"] == json.loads(off.out)["tokens"]
    common = ["bench", "-m", files["q8"], "-p", "0", "-n", "3", "-r", "1", "-t", "1", "-o", "json", "--no-warmup",
              "--nnapi-lib", standin.path]
    (on,), (no,) = (json.loads(cli(*common, "--npu-gbps", g).out) for g in ("1e6", "1e-6"))
    assert on["pi2_npu"] == "nnapi" and on["pi2_npu_runs"] == 3 * 2 and on["pi2_npu_fallbacks"] == 0
    assert on["pi2_npu_bytes"] == npu_plan.copy_bytes(64, 256, [256, 256])
    assert no["pi2_npu"] == "off"


def test_cli_verbose_names_the_failure_once(standin, files):
    args = ["run", files["q8"], "-p", "one two three", "-n", "4", "--temp", "0", "--json", "-t", "1"]
    off = cli(*args, "--npu", "off")
    standin.set(fail_execute=1)
    failed = cli(*args, "--npu", "nnapi", "--nnapi-lib", standin.path, "--npu-gbps", "1e6", "--verbose")
    assert failed.code == 0 and json.loads(failed.out)["tokens"] == json.loads(off.out)["tokens"]
    lines = re.findall(r"^pi2: npu: NNAPI: running the hot FFN \[256 x 64\] graph failed \(OP_FAILED\): computed on "
                       r"the CPU$", failed.err, re.M)
    assert len(lines) == 1, failed.err                                  # one line per distinct reason


@pytest.mark.parametrize("args, msg", [(["--npu-gbps", "0"], "invalid --npu-gbps 0"),
                                       (["--npu-gbps", "-3"], "invalid --npu-gbps -3"),
                                       (["--npu", "npu"], "unknown --npu 'npu'")])
def test_bad_npu_flags(files, args, msg):
    for cmd in (["plan", files["q8"], "--memory-budget", "400M"], ["run", files["q8"], "-p", "x", "-n", "1"]):
        r = cli(*cmd, *args)
        assert r.code == 2 and r.err.startswith(f"pi2: error: {msg}") and "Traceback" not in r.err, r.err
