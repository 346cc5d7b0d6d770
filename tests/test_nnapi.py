"""test_nnapi.py — the NNAPI delegate (csrc/nnapi/nnapi.c, csrc/nnapi/batches.c, pi2/runtime/npu.py) against a stand-in
libneuralnetworks.so built here from tests/c/nnapi_standin.c: the graphs pi2 builds (operand codes and
types, shapes, bias, fuse codes, input/output indexes), results against numpy and pi2.reference.sparse_ffn, asynchronous
runs overlapping CPU work, every fallback (no library, missing symbol, no accelerator, unsupported
operation, compile, start and execution failures), and `--npu` on run and bench.
F16 tolerance: weights, activations and every intermediate are rounded to F16 (relative error ~5e-4 per
rounding), so results are compared by NMSE <= 1e-5 against float64 numpy.
"""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np
import pytest

from clirun import cli
from fixtures import write_model
from standin import libs, nmse, standin  # noqa: F401 (libs, standin: fixtures)
from pi2 import engine
from pi2.runtime import npu
from pi2.engine import CContext, CModel
from pi2.engine.nnapi import NnapiDelegate, ctx_nnapi_stats, ctx_set_nnapi
from pi2.errors import UnsupportedError
from pi2.model.loader import load_model
from pi2.runtime.config import RunConfig
from pi2.runtime.session import open_session
from pi2.reference.sparse_ffn import combine

ROOT = Path(__file__).resolve().parent.parent
NMSE_F16 = 1e-5
FC, LOGISTIC, MUL, RELU, BMM = 9, 14, 18, 19, 102
T_F32, T_F16, S_INT32, S_BOOL = 3, 8, 1, 6
LEVEL_6 = 1000006


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = write_model(tmp_path_factory.mktemp("nnm") / "m.gguf", n_layer=2)
    m = load_model(path)
    return m, CModel.from_model(m)


@pytest.fixture(scope="module")
def tiny_f32(tmp_path_factory):
    """F32 weights: the CPU path's activations stay F32 too, so the only difference is NNAPI's F16."""
    path = write_model(tmp_path_factory.mktemp("nnm32") / "m.gguf", n_layer=2, wtype="F32")
    m = load_model(path)
    return m, CModel.from_model(m)


def f16(a):
    return np.asarray(a, np.float32).astype(np.float16).astype(np.float64)


# ---- the ABI ----------------------------------------------------------------------------------

def test_enum_values_are_nnapis():
    """nnapi/abi.h's values are those of reference/nnapi.md §4 (AOSP NeuralNetworksTypes.h)."""
    text = (ROOT / "csrc/nnapi/abi.h").read_text()
    vals = {k: int(v) for k, v in re.findall(r"\b(NN_[A-Z0-9_]+) = (\d+)", text)}
    want = {"NN_FLOAT32": 0, "NN_INT32": 1, "NN_TENSOR_FLOAT32": 3, "NN_TENSOR_INT32": 4, "NN_TENSOR_QUANT8_ASYMM": 5,
            "NN_TENSOR_FLOAT16": 8, "NN_TENSOR_QUANT8_ASYMM_SIGNED": 14, "NN_OP_ADD": 0, "NN_OP_FULLY_CONNECTED": 9,
            "NN_OP_LOGISTIC": 14, "NN_OP_MUL": 18, "NN_OP_RESHAPE": 22, "NN_OP_BATCH_MATMUL": 102,
            "NN_FUSED_NONE": 0, "NN_FUSED_RELU": 1, "NN_PREFER_SUSTAINED_SPEED": 2, "NN_DEVICE_CPU": 2,
            "NN_DEVICE_GPU": 3, "NN_DEVICE_ACCELERATOR": 4, "NN_BAD_DATA": 4, "NN_OP_FAILED": 5,
            "NN_UNAVAILABLE_DEVICE": 9, "NN_DEAD_OBJECT": 14, "NN_FEATURE_LEVEL_3": 29}
    assert {k: vals.get(k) for k in want} == want


def test_no_library_is_unsupported():
    with pytest.raises(UnsupportedError, match="NNAPI unavailable"):
        NnapiDelegate("/nonexistent/libneuralnetworks.so")


def test_missing_symbol_is_unsupported(libs):
    with pytest.raises(UnsupportedError, match="ANeuralNetworksEvent_wait"):
        NnapiDelegate(libs["no_wait"])


def test_devices_and_selection(standin):
    d = NnapiDelegate(standin.path)
    assert d.devices() == [{"name": "standin-npu", "type": "accelerator", "feature_level": 31, "selected": True},
                           {"name": "nnapi-reference", "type": "cpu", "feature_level": 31, "selected": True}]
    assert d.runtime_feature_level == 31
    acc = NnapiDelegate(standin.path, accelerators_only=True)
    assert [x["selected"] for x in acc.devices()] == [True, False]
    standin.set(accelerator=0)
    none = NnapiDelegate(standin.path, accelerators_only=True)
    assert [x["name"] for x in none.devices()] == ["nnapi-reference"] and not none.devices()[0]["selected"]
    with pytest.raises(UnsupportedError, match="no device selected"):
        none.fc([np.ones((4, 4), np.float32)])
    assert any("no device selected" in n for n in none.notes())


# ---- graphs -----------------------------------------------------------------------------------

def test_fc_group_graph_and_results(standin):
    rng = np.random.default_rng(1)
    ws = [rng.standard_normal((n, 33)).astype(np.float32) for n in (17, 5, 31)]
    x = rng.standard_normal((7, 33)).astype(np.float32)
    d = NnapiDelegate(standin.path)
    g = d.fc(ws)
    assert g.bytes >= 2 * sum(w.size for w in ws)            # the F16 copies
    outs = g.run(x)
    for w, o in zip(ws, outs):
        assert o.shape == (7, w.shape[0])
        assert nmse(o, f16(x) @ f16(w).T) <= NMSE_F16
    (gr,) = standin.graphs()
    ops, opd = gr["operations"], gr["operands"]
    assert opd[0] == {"type": T_F16, "dims": [7, 33], "const": 0}
    assert gr["inputs"] == [0] and gr["relaxed"] == 0
    assert [op["type"] for op in ops] == [FC, FC, FC]
    assert gr["outputs"] == [op["outputs"][0] for op in ops]
    for w, op in zip(ws, ops):
        xi, wi, bi, fi = op["inputs"]
        assert xi == 0
        assert opd[wi] == {"type": T_F16, "dims": [w.shape[0], 33], "const": 1, "zero": 0}
        assert opd[bi] == {"type": T_F16, "dims": [w.shape[0]], "const": 1, "zero": 1}
        assert opd[fi] == {"type": S_INT32, "dims": [], "const": 1, "value": 0}
        assert opd[op["outputs"][0]] == {"type": T_F16, "dims": [7, w.shape[0]], "const": 0}


def test_fc_from_quantized_rows(standin, tiny):
    """ggml rows (Q8_0 here) are dequantized once into the copy; results match pi2's own dequantization."""
    m, _ = tiny
    t = m.tensor("blk.0.attn_q.weight")
    raw = np.frombuffer(Path(m.path).read_bytes()[t.offset:t.offset + t.nbytes], np.uint8)
    w = engine.dequantize(raw, t.type, t.ne[0])
    x = np.random.default_rng(2).standard_normal((9, t.ne[0])).astype(np.float32)
    (o,) = NnapiDelegate(standin.path).fc([(raw, t.type, t.ne[0])]).run(x)
    assert nmse(o, f16(x) @ f16(w).T) <= NMSE_F16


def test_compiled_once_per_batch_size(standin):
    d = NnapiDelegate(standin.path, max_shapes=2)
    g = d.fc([np.eye(8, dtype=np.float32)])
    for n in (3, 3, 5, 3, 5):
        (o,) = g.run(np.ones((n, 8), np.float32))
        assert o.shape == (n, 8) and np.all(o == 1)
    assert [gr["operands"][0]["dims"][0] for gr in standin.graphs()] == [3, 5]
    g.run(np.ones((6, 8), np.float32))          # a third size drops the least recently used (3)
    g.run(np.ones((3, 8), np.float32))
    assert [gr["operands"][0]["dims"][0] for gr in standin.graphs()] == [3, 5, 6, 3]


def ffn_weights(seed=3, E=40, F=96):
    rng = np.random.default_rng(seed)
    s = 1 / np.sqrt(E)
    return (rng.standard_normal((F, E)).astype(np.float32) * s, rng.standard_normal((F, E)).astype(np.float32) * s,
            rng.standard_normal((E, F)).astype(np.float32) / np.sqrt(F))


@pytest.mark.parametrize("act", ["silu", "relu"])
def test_hot_ffn_graph_and_results(standin, act):
    gate, up, down = ffn_weights()
    H = 48
    x = np.random.default_rng(4).standard_normal((6, 40)).astype(np.float32)
    d = NnapiDelegate(standin.path)
    (y,) = d.ffn(act, gate, up, down, H).run(x)
    (y_t,) = d.ffn(act, gate, up, np.ascontiguousarray(down.T), H, down_t=True).run(x)
    # the sparse FFN's math over the hot prefix, in float32 (pi2.reference.sparse_ffn.combine), then down
    g, u = (x @ gate[:H].T).astype(np.float32), (x @ up[:H].T).astype(np.float32)
    ref = combine(g, u, act).astype(np.float64) @ down[:, :H].T.astype(np.float64)
    assert y.shape == (6, 40)
    assert nmse(y, ref) <= NMSE_F16 and nmse(y_t, ref) <= NMSE_F16
    gr = standin.graphs()[0]
    ops, opd = gr["operations"], gr["operands"]
    fcs = [op for op in ops if op["type"] == FC]
    assert len(fcs) == 3
    gate_op, up_op, down_op = fcs
    assert gate_op["inputs"][0] == 0 and up_op["inputs"][0] == 0
    assert opd[gate_op["inputs"][1]]["dims"] == [H, 40] and opd[up_op["inputs"][1]]["dims"] == [H, 40]
    assert opd[down_op["inputs"][1]]["dims"] == [40, H] and opd[down_op["inputs"][2]] == \
        {"type": T_F16, "dims": [40], "const": 1, "zero": 1}
    assert gr["outputs"] == down_op["outputs"] and opd[gr["outputs"][0]]["dims"] == [6, 40]
    mul_last = [op for op in ops if op["type"] == MUL][-1]
    assert down_op["inputs"][0] == mul_last["outputs"][0]             # down(h), h = a * up
    assert up_op["outputs"][0] in mul_last["inputs"][:2]
    if act == "silu":                                                 # a = g * LOGISTIC(g)
        assert [op["type"] for op in ops] == [FC, LOGISTIC, MUL, FC, MUL, FC]
        g_out = gate_op["outputs"][0]
        assert ops[1]["inputs"] == [g_out] and ops[2]["inputs"][:2] == [g_out, ops[1]["outputs"][0]]
        assert opd[gate_op["inputs"][3]]["value"] == 0
    else:                                                             # a = FC(..., FUSED_RELU)
        assert [op["type"] for op in ops] == [FC, FC, MUL, FC]
        assert opd[gate_op["inputs"][3]] == {"type": S_INT32, "dims": [], "const": 1, "value": 1}
        assert mul_last["inputs"][0] == gate_op["outputs"][0]


def test_hot_ffn_from_a_model_layer(standin, tiny):
    """The lead's call: Q8_0 rows of a real layer, down as stored (ffn_down, n_hot a block multiple)."""
    m, _ = tiny
    raw = Path(m.path).read_bytes()
    mats = {}
    for name in ("ffn_gate", "ffn_up", "ffn_down"):
        t = m.tensor(f"blk.1.{name}.weight")
        rows = np.frombuffer(raw[t.offset:t.offset + t.nbytes], np.uint8)
        mats[name] = ((rows, t.type, t.ne[0]), engine.dequantize(rows, t.type, t.ne[0]))
    H = 64
    x = np.random.default_rng(5).standard_normal((4, m.config.n_embd)).astype(np.float32)
    (y,) = NnapiDelegate(standin.path).ffn("silu", mats["ffn_gate"][0], mats["ffn_up"][0], mats["ffn_down"][0], H).run(x)
    gw, uw, dw = (mats[n][1] for n in ("ffn_gate", "ffn_up", "ffn_down"))
    ref = combine(x @ gw[:H].T, x @ uw[:H].T, "silu").astype(np.float64) @ dw[:, :H].T
    assert nmse(y, ref) <= NMSE_F16


def test_gelu_has_no_graph(standin):
    gate, up, down = ffn_weights()
    d = NnapiDelegate(standin.path)
    with pytest.raises(UnsupportedError, match="activation"):
        d.ffn("gelu", gate, up, down, 32)
    assert any("activation" in n for n in d.notes())


def test_old_devices_get_f32_relaxed(standin):
    standin.set(device_level=28)
    d = NnapiDelegate(standin.path)
    assert any("F32" in n for n in d.notes())
    w = np.random.default_rng(6).standard_normal((9, 16)).astype(np.float32)
    x = np.random.default_rng(7).standard_normal((3, 16)).astype(np.float32)
    (o,) = d.fc([w]).run(x)
    assert np.allclose(o, x @ w.T, rtol=1e-5, atol=1e-5)
    gr = standin.graphs()[0]
    assert gr["relaxed"] == 1 and {o["type"] for o in gr["operands"] if o["dims"]} == {T_F32}


def test_batch_matmul_needs_feature_level_6(standin):
    d = NnapiDelegate(standin.path, batch_matmul=True)
    assert any("BATCH_MATMUL needs feature level 6" in n for n in d.notes())
    d.fc([np.eye(4, dtype=np.float32)]).run(np.ones((2, 4), np.float32))
    assert [op["type"] for op in standin.graphs()[0]["operations"]] == [FC]


@pytest.mark.parametrize("act", ["silu", "relu"])
def test_batch_matmul_graphs(standin, act):
    """On level-6 devices, BATCH_MATMUL(x, W, adj_x false, adj_y true) replaces FULLY_CONNECTED (RELU apart)."""
    standin.set(device_level=LEVEL_6, runtime_level=LEVEL_6)
    d = NnapiDelegate(standin.path, batch_matmul=True)
    assert d.notes() == [] and d.runtime_feature_level == LEVEL_6
    rng = np.random.default_rng(8)
    ws = [rng.standard_normal((n, 24)).astype(np.float32) for n in (10, 3)]
    x = rng.standard_normal((5, 24)).astype(np.float32)
    outs = d.fc(ws).run(x)
    assert all(nmse(o, f16(x) @ f16(w).T) <= NMSE_F16 for w, o in zip(ws, outs))
    gate, up, down = ffn_weights()
    x = rng.standard_normal((3, 40)).astype(np.float32)
    (y,) = d.ffn(act, gate, up, down, 32).run(x)
    ref = combine(x @ gate[:32].T, x @ up[:32].T, act).astype(np.float64) @ down[:, :32].T
    assert nmse(y, ref) <= NMSE_F16
    fc_graph, ffn_graph = standin.graphs()
    opd = fc_graph["operands"]
    assert [op["type"] for op in fc_graph["operations"]] == [BMM, BMM]
    for w, op in zip(ws, fc_graph["operations"]):
        xi, wi, ax, ay = op["inputs"]
        assert xi == 0 and opd[wi]["dims"] == [w.shape[0], 24] and opd[wi]["const"] == 1
        assert opd[ax] == {"type": S_BOOL, "dims": [], "const": 1, "value": 0}
        assert opd[ay] == {"type": S_BOOL, "dims": [], "const": 1, "value": 1}
        assert opd[op["outputs"][0]]["dims"] == [5, w.shape[0]]
    assert not any(o["type"] == S_INT32 for o in opd)                 # no unused fuse operands
    want = [BMM, LOGISTIC, MUL, BMM, MUL, BMM] if act == "silu" else [BMM, RELU, BMM, MUL, BMM]
    assert [op["type"] for op in ffn_graph["operations"]] == want


def test_runs_overlap_cpu_work(standin):
    """start() returns before the device finishes; the CPU computes meanwhile; wait() delivers."""
    standin.set(delay_ms=300)
    g = NnapiDelegate(standin.path).fc([np.eye(16, dtype=np.float32)])
    g.run(np.ones((4, 16), np.float32))                    # compile outside the timed part
    t0 = time.perf_counter()
    assert g.start(np.full((4, 16), 2, np.float32))
    t_start = time.perf_counter() - t0
    assert standin.executions() == 1                       # the new run has not finished
    a = np.ones((64, 64))
    while time.perf_counter() - t0 < 0.3:                  # CPU work meanwhile
        a = a @ a / 64
    (o,) = g.wait()
    total = time.perf_counter() - t0
    assert standin.executions() == 2 and np.all(o == 2)
    assert t_start < 0.15 and total < 0.55, (t_start, total)


@pytest.mark.parametrize("fail, phase", [("fail_compile", "compiling"), ("unsupported", "do not support"),
                                         ("fail_start", "starting"), ("fail_execute", "running")])
def test_each_failure_falls_back_once(standin, fail, phase):
    standin.set(**{fail: 1})
    d = NnapiDelegate(standin.path)
    g = d.fc([np.eye(8, dtype=np.float32)])
    assert g.run(np.ones((2, 8), np.float32)) is None
    assert [n for n in d.notes() if phase in n], d.notes()
    seen = (len(standin.graphs()), standin.executions())
    standin.set(**{fail: 0})
    assert g.run(np.ones((2, 8), np.float32)) is None      # not tried again
    assert (len(standin.graphs()), standin.executions()) == seen
    assert len(d.notes()) == 1
    assert d.fc([np.eye(8, dtype=np.float32)]).run(np.ones((2, 8), np.float32)) is not None   # other graphs still run


# ---- a context's prompt batches -----------------------------------------------------------------

def test_context_prompt_batches_on_nnapi(standin, tiny_f32):
    m, cm = tiny_f32
    toks = list(range(1, 21))
    cpu = CContext(cm, 64, n_threads=1).decode(toks, all_logits=True)
    ctx = CContext(cm, 64, n_threads=1)
    ctx_set_nnapi(ctx, NnapiDelegate(standin.path), min_batch=8)
    st = ctx_nnapi_stats(ctx)
    need = npu.copy_bytes(m.config)                        # what pi2/runtime/npu.py weighs before attaching
    assert need <= st["bytes"] <= 1.1 * need and st["runs"] == 0
    out = ctx.decode(toks, all_logits=True)
    L, E = m.config.n_layer, m.config.n_embd
    assert ctx_nnapi_stats(ctx)["runs"] == 4 * L            # q/k/v, output, gate/up, down per layer
    assert nmse(out, cpu) <= NMSE_F16                      # F16 graphs vs the F32 CPU path, 2 layers
    assert np.array_equal(out.argmax(1), cpu.argmax(1))
    graphs = standin.graphs()
    assert len(graphs) == 4 * L and all(g["operands"][0]["dims"][0] == 20 for g in graphs)
    assert [len(g["outputs"]) for g in graphs[:4]] == [3, 1, 2, 1]
    assert graphs[0]["operands"][0]["dims"] == [20, E]
    ctx.decode([5])                                        # one token: the CPU
    assert ctx_nnapi_stats(ctx)["runs"] == 4 * L


def test_context_failure_is_the_cpu_result(standin, tiny):
    """Every product whose graph fails is computed by the CPU path: logits identical to a CPU context."""
    _, cm = tiny
    toks = list(range(3, 19))
    cpu = CContext(cm, 64, n_threads=1).decode(toks, all_logits=True)
    standin.set(fail_execute=1)
    ctx = CContext(cm, 64, n_threads=1)
    ctx_set_nnapi(ctx, NnapiDelegate(standin.path), min_batch=8)
    assert np.array_equal(ctx.decode(toks, all_logits=True), cpu)
    st = ctx_nnapi_stats(ctx)
    n_exec = standin.executions()
    ctx.reset()
    assert np.array_equal(ctx.decode(toks, all_logits=True), cpu)
    assert st["runs"] == 0 and st["fallbacks"] > 0 and standin.executions() == n_exec


def test_missing_library_is_a_silent_cpu_run(tiny, capsys):
    m, _ = tiny
    toks = list(range(2, 30))
    off = open_session(m, RunConfig(n_ctx=64, n_threads=1, npu="off"))
    auto = open_session(m, RunConfig(n_ctx=64, n_threads=1, npu="auto", nnapi_lib="/nonexistent/libneuralnetworks.so"))
    assert np.array_equal(auto.decode(toks, all_logits=True), off.decode(toks, all_logits=True))
    assert auto.npu.state == "off" and capsys.readouterr().err == ""


def test_auto_skips_copies_that_do_not_fit(standin, tiny, monkeypatch):
    m, _ = tiny
    monkeypatch.setattr(npu, "mem_available", lambda: npu.copy_bytes(m.config))     # twice the copies needed
    ctx = open_session(m, RunConfig(n_ctx=64, n_threads=1, npu="auto", nnapi_lib=standin.path))
    assert ctx.npu.state == "off" and "more than half of the available memory" in npu.notes(ctx.npu)[0]
    forced = open_session(m, RunConfig(n_ctx=64, n_threads=1, npu="nnapi", nnapi_lib=standin.path))
    assert forced.npu.state == "nnapi"


def test_cli_npu_modes(standin, tiny):
    m, _ = tiny
    args = ["run", m.path, "-p", "one two three four five six seven eight nine ten", "-n", "3", "--temp", "0",
            "--json", "--nnapi-lib"]
    off = cli(*args, "/nonexistent/libneuralnetworks.so", "--npu", "off")
    auto = cli(*args, "/nonexistent/libneuralnetworks.so")
    missing = cli(*args, "/nonexistent/libneuralnetworks.so", "--npu", "nnapi")
    assert off.code == auto.code == missing.code == 0
    assert json.loads(off.out)["tokens"] == json.loads(auto.out)["tokens"] == json.loads(missing.out)["tokens"]
    assert auto.err == ""
    assert re.fullmatch(r"pi2: note: --npu nnapi: NNAPI unavailable: .*; running on the CPU\n", missing.err)
    used = cli(*args, standin.path, "--npu", "nnapi", "--verbose")
    assert used.code == 0 and len(standin.graphs()) > 0
    standin.set(fail_compile=1)
    failed = cli(*args, standin.path, "--npu", "nnapi", "--verbose")
    assert failed.code == 0 and json.loads(failed.out)["tokens"] == json.loads(off.out)["tokens"]
    assert re.search(r"^pi2: npu: NNAPI: compiling the .* graph failed \(OP_FAILED\): computed on the CPU$",
                     failed.err, re.M), failed.err
    standin.set(fail_compile=0, accelerator=0)
    cpu_only = cli(*args, standin.path, "--verbose")       # auto: NNAPI's CPU device is not worth it
    assert cpu_only.code == 0 and "no GPU or accelerator" in cpu_only.err
    bad = cli("run", m.path, "-p", "x", "--npu", "npu")
    assert bad.code == 2 and "unknown --npu" in bad.err


def test_bench_reports_the_npu(standin, tiny):
    m, _ = tiny
    common = ["bench", "-m", m.path, "-p", "16", "-n", "0", "-r", "1", "-t", "1", "-o", "json", "--no-warmup"]
    on = cli(*common, "--npu", "nnapi", "--nnapi-lib", standin.path)
    off = cli(*common, "--npu", "off")
    assert on.code == 0 and off.code == 0, (on.err, off.err)
    (r_on,), (r_off,) = json.loads(on.out), json.loads(off.out)
    assert r_on["pi2_npu"] == "nnapi" and r_on["pi2_npu_devices"] == "standin-npu,nnapi-reference"
    assert r_on["pi2_npu_bytes"] > 0 and r_on["pi2_npu_runs"] == 4 * m.config.n_layer
    assert r_off["pi2_npu"] == "off" and "pi2_npu_bytes" not in r_off
