"""test_sparse.py — the sparse FFN of the reference: keep = 1 is the dense FFN bit for bit (plain GGUF and pi2
files), PowerInfer `PWRI` files equal an independent numpy implementation of PowerInfer's semantics, the
active-set rules on hand-checked cases, the allocation of a model-wide keep, and `--keep` / `--dense` on
run, perplexity and bench; on SmolLM2, the perplexity cost of on-the-fly per-token thresholds.
The oracle test (test_pi2_file_keep_one) reads a pi2 file written here from the format's description alone
(docs/pi2-file-format.md), not by `pi2 convert`: the reader and the converter are checked against the format,
not against each other."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest
from clirun import assert_error, cli
from conftest import model_file
from fixtures import TEXT, write_model
from gguf import GGMLQuantizationType as QT
from gguf import GGUFReader
from gguf.quants import dequantize as gg_dequantize
from pi2file import convert_pi2, writer_like

from pi2.errors import UsageError
from pi2.model.loader import load_model
from pi2.reference.quants import QuantLinear
from pi2.reference.forward import ReferenceContext, rms_norm
from pi2.reference import sparse_ffn as sparse
from pi2.runtime import ffn_rule

TOKENS = [1, 5, 9, 200, 33, 7, 80, 90, 311, 42, 17, 64]


def logits(path, **kw) -> np.ndarray:
    m = load_model(path)
    ctx = ReferenceContext(m, 32, ffn_rule.choose_rule(m, **kw))
    out = ctx.decode(TOKENS[:8], all_logits=True)
    return np.concatenate([out, ctx.decode(TOKENS[8:], all_logits=True)])   # a batch, then a continuation


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("sp") / "plain.gguf", wtype="Q8_0")


@pytest.fixture(scope="module")
def pi2_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("pi2")
    src = write_model(d / "src.gguf", wtype="F32")
    srcq = write_model(d / "srcq.gguf", wtype="Q8_0", seed=3)
    return {"src": src, "f32": oracle_pi2(src, d / "f32.pi2.gguf"), "srcq": srcq,
            "gud": convert_pi2(srcq, d / "gud.pi2.gguf", layout="bundle-gud", down_type="Q8_0", default_keep=0.5)}


def oracle_pi2(src, dst):
    """The pi2 file of the plain GGUF `src` as the format describes it, written without the converter: each layer's
    neurons in reversed order, the gate rows as their own tensor, the bundle records holding the up row then the
    down row as F32 (down transposed: row i is neuron i's column), padded to 32 bytes; frequencies descending, and
    a keep grid (0.5, 1.0) whose 1.0 threshold is 0 (every neuron)."""
    r = GGUFReader(str(src))
    w = writer_like(r, dst)
    t = {x.name: x for x in r.tensors}
    n_layer = sum(1 for n in t if n.endswith(".ffn_gate.weight"))
    w.add_uint32("pi2.version", 1)
    w.add_string("pi2.ffn.layout", "bundle-ud")
    w.add_array("pi2.ffn.keep_grid", [0.5, 1.0])
    w.add_float32("pi2.ffn.default_keep", 1.0)
    w.add_array("pi2.ffn.down_types", [int(QT.F32)] * n_layer)
    for x in r.tensors:
        if not any(f".{n}." in x.name for n in ("ffn_gate", "ffn_up", "ffn_down")):
            w.add_tensor(x.name, np.asarray(x.data), raw_dtype=x.tensor_type)
    for il in range(n_layer):
        b = f"blk.{il}."
        gate, up, down = (t[b + n + ".weight"] for n in ("ffn_gate", "ffn_up", "ffn_down"))
        n_embd, n_ff = int(gate.shape[0]), int(gate.shape[1])
        perm = np.arange(n_ff, dtype=np.int32)[::-1].copy()
        rows = lambda x, n: np.ascontiguousarray(x.data).view(np.uint8).reshape(n, -1)   # noqa: E731
        down_rows = np.ascontiguousarray(rows(down, n_embd).view(np.float32).T[perm])     # F32 source: exact
        rec = np.concatenate([rows(up, n_ff)[perm], down_rows.view(np.uint8)], axis=1)
        rec = np.pad(rec, ((0, 0), (0, -rec.shape[1] % 32)))
        w.add_tensor(b + "ffn_gate.weight", rows(gate, n_ff)[perm], raw_dtype=gate.tensor_type)
        w.add_tensor(b + "ffn_bundle.weight", rec.view(np.int8))
        w.add_tensor(b + "ffn_perm.weight", perm)
        w.add_tensor(b + "ffn_freq.weight", np.linspace(1.0, 0.0, n_ff, dtype=np.float32))
        w.add_tensor(b + "ffn_thresh.weight", np.array([0.5, 0.0], np.float32))
        w.add_tensor(b + "ffn_err.weight", np.array([0.1, 0.0], np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


# ------------------------------------------------------------------ keep = 1 is dense

def test_keep_one_is_dense_bit_for_bit(plain):
    dense = logits(plain, dense=True)
    assert np.array_equal(logits(plain), dense)
    assert np.array_equal(logits(plain, keep=1.0), dense)
    m = load_model(plain)              # the masked path itself with every neuron active
    ctx = ReferenceContext(m, 32)
    ctx.ffn.rule, ctx.ffn.keep = "topk", 1.0
    assert np.array_equal(np.concatenate([ctx.decode(TOKENS[:8], all_logits=True),
                                          ctx.decode(TOKENS[8:], all_logits=True)]), dense)
    assert ctx.bench_stats()["ffn_keep"] == 1.0


def test_pi2_file_keep_one(pi2_files):
    src, f32 = logits(pi2_files["src"]), logits(pi2_files["f32"], dense=True)
    assert np.array_equal(logits(pi2_files["f32"], keep=1.0), f32)
    assert np.array_equal(logits(pi2_files["f32"]), f32)       # default_keep 1.0
    np.testing.assert_allclose(f32, src, rtol=1e-5, atol=5e-5)  # permuted, bundled, down as f32 rows
    gud = load_model(pi2_files["gud"])
    assert gud.config.pi2 and gud.config.ffn_layout == "bundle-gud" and "blk.0.ffn_gate.weight" not in gud.file.tensors
    np.testing.assert_allclose(logits(pi2_files["gud"], dense=True), logits(pi2_files["srcq"]), rtol=0.05, atol=0.5)


def test_pi2_thresholds_at_default_keep(pi2_files):
    m = load_model(pi2_files["gud"])
    ctx = ReferenceContext(m, 32)                               # default_keep 0.5 from the file
    assert ctx.ffn.rule == "threshold" and ctx.ffn.keep == 0.5
    assert abs(ctx.ffn.layer_keep.mean() - 0.5) < 1e-9
    grid = np.asarray(m.file.kv["pi2.ffn.keep_grid"])
    for il, k in enumerate(ctx.ffn.layer_keep):
        thr = m.raw(f"blk.{il}.ffn_thresh.weight").view(np.float32)[0]
        assert ctx.ffn.thresholds[il] == np.float32(np.interp(k, grid, thr))
    ctx.decode(TOKENS)
    s = ctx.bench_stats()
    assert 0.3 < s["ffn_keep"] < 0.7
    dense = ReferenceContext(m, 32, ffn_rule.choose_rule(m, dense=True))
    dense.decode(TOKENS)
    assert s["ffn_bytes_per_token"] < dense.bench_stats()["ffn_bytes_per_token"]


def test_pi2_file_loads_and_bad_layout_is_one_line(pi2_files, tmp_path):
    assert cli("info", str(pi2_files["f32"])).code == 0
    bad = tmp_path / "bad.pi2.gguf"
    blob = pi2_files["f32"].read_bytes().replace(b"bundle-ud", b"bundle-xx", 1)
    bad.write_bytes(blob)
    assert_error(cli("run", str(bad), "-p", "x", "-n", "1"), 1, "pi2.ffn.layout")


# ------------------------------------------------------------------ PowerInfer PWRI files

def _raw(m, name):
    t = m.tensor(name)
    return gg_dequantize(np.asarray(m.raw(name)), QT(t.type)).reshape(-1, t.ne[0]).astype(np.float64)


def powerinfer_ffn(m, threshold):
    """PowerInfer's sparse FFN (formats.md §9.4), written independently: predictor scores fc2·relu(fc1·p) on the
    pre-norm residual p, active = score >= threshold, the same mask for gate, up and down_t, ReGLU (dReLU for
    bamboo: relu(gate)·relu(up)), and the down axpy over active neurons with h != 0. float64 throughout, except that ggml multiplies F16 weights with
    activations rounded to F16."""
    W = [{n: _raw(m, f"blk.{il}.{n}.weight") for n in ("fc1", "fc2", "ffn_gate", "ffn_up", "ffn_down_t")}
         for il in range(m.config.n_layer)]
    seen, masks = [], []
    f16 = m.tensor("blk.0.ffn_gate.weight").type_name == "F16"
    rnd = (lambda v: v.astype(np.float16).astype(np.float64)) if f16 else (lambda v: v)  # noqa: E731

    def ffn(il, L, x, h_pre, trace=None):
        w = W[il]
        y = np.zeros((x.shape[0], m.config.n_embd))
        for t in range(x.shape[0]):
            s = w["fc2"] @ rnd(np.maximum(w["fc1"] @ rnd(h_pre[t]), 0).astype(np.float32))
            idx = np.flatnonzero(s >= threshold)
            masks.append(s >= threshold)
            xt = rnd(x[t])
            up = w["ffn_up"][idx] @ xt
            h = np.maximum(w["ffn_gate"][idx] @ xt, 0) * (np.maximum(up, 0) if m.config.arch == "bamboo" else up)
            nz = h != 0
            y[t] = h[nz] @ w["ffn_down_t"][idx[nz]]
            seen.append(len(idx) / len(s))
        return y.astype(np.float32)
    return ffn, seen, masks


@pytest.mark.parametrize("wtype,arch", [("F32", "llama"), ("F16", "llama"), ("F32", "bamboo")])
def test_pwri_equals_powerinfer_semantics(tmp_path, wtype, arch):
    path = write_model(tmp_path / "s.powerinfer.gguf", arch, pwri=True, wtype=wtype, pred_rank=8, n_layer=3)
    m = load_model(path)
    assert m.config.sparse and m.config.ffn_act == ("drelu" if arch == "bamboo" else "relu") and m.extra == []
    ctx = ReferenceContext(m, 32)
    assert ctx.ffn.rule == "predictor"
    got_masks = []
    ctx.trace = lambda name, il, t: got_masks.append(t) if name == "ffn_mask" else None
    got = ctx.decode(TOKENS, all_logits=True)
    ind = ReferenceContext(m, 32)
    ind.ffn, seen, masks = powerinfer_ffn(m, 0.0)
    want = ind.decode(TOKENS, all_logits=True)
    assert 0.2 < np.mean(seen) < 0.8                          # the predictor really drops neurons
    got_masks = np.concatenate([g.reshape(-1) for g in got_masks])
    assert np.mean(got_masks == np.concatenate(masks)) > 0.999     # both layer, token, neuron order
    # the summation order of ggml's dot products (F16) or of the BLAS numpy links (F32; it differs between CPUs)
    # against these float32 matmuls can flip a neuron whose score is ~1e-4 from the threshold
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=5e-3 if wtype == "F32" else 1e-2)
    assert abs(ctx.bench_stats()["ffn_keep"] - np.mean(seen)) < 0.01
    dense = ReferenceContext(m, 32, ffn_rule.choose_rule(m, dense=True)).decode(TOKENS, all_logits=True)
    assert not np.allclose(dense, got, atol=1e-3)


def test_pwri_threshold_key(tmp_path, monkeypatch):
    path = write_model(tmp_path / "s.gguf", pwri=True, wtype="F32", pred_rank=8)
    m = load_model(path)
    lo, hi = ReferenceContext(m, 32), ReferenceContext(m, 32)
    hi.ffn.threshold = 1.0
    lo.decode(TOKENS)
    hi.decode(TOKENS)
    assert hi.bench_stats()["ffn_keep"] < lo.bench_stats()["ffn_keep"]


def test_full_rank_predictor_matches_relu_gate(tmp_path):
    """The fixture's full-rank predictor scores rms(p)·gate(ffn_norm(p)): its mask is the ReLU gate's."""
    path = write_model(tmp_path / "s.gguf", pwri=True, wtype="F32")
    m = load_model(path)
    L = ReferenceContext(m, 8).w.layers[0]
    p = np.random.default_rng(1).standard_normal((6, m.config.n_embd)).astype(np.float32)
    x = rms_norm(p, L["ffn_norm"], m.config.rms_eps)
    pm, gm = sparse.predictor_mask(p, L["fc1"], L["fc2"]), sparse.relu_mask(L["ffn_gate"](x))
    assert (pm == gm).mean() > 0.98


# ------------------------------------------------------------------ rules and allocation

def _lin(a):
    a = np.asarray(a, np.float32)
    return QuantLinear.from_raw(a.view(np.uint8).reshape(a.shape[0], -1), 0, a.shape[1])


def test_rules_hand_checked():
    fc1 = _lin([[1, 0], [0, 1]])          # relu(p)
    fc2 = _lin([[1, -1], [0, 1], [-1, 0]])
    p = np.array([[2.0, 1.0], [-1.0, 3.0]], np.float32)
    # relu(p) = [2, 1] -> scores [1, 1, -2];  [0, 3] -> [-3, 3, 0]
    assert sparse.predictor_scores(p, fc1, fc2).tolist() == [[1, 1, -2], [-3, 3, 0]]
    assert sparse.predictor_mask(p, fc1, fc2).tolist() == [[True, True, False], [False, True, True]]  # 0 >= 0
    assert sparse.predictor_mask(p, fc1, fc2, 1.0).tolist() == [[True, True, False], [False, True, False]]
    g = np.array([[-0.5, 0.0, 0.25, 3.0]], np.float32)
    assert sparse.relu_mask(g).tolist() == [[False, False, True, True]]
    assert sparse.threshold_mask(np.array([-0.3, 0.1, 0.2, 0.5]), 0.2).tolist() == [True, False, False, True]
    s = np.array([[0.1, -0.9, 0.5, 0.5, 0.0]], np.float32)
    assert sparse.topk_mask(s, 0.4).tolist() == [[False, True, True, False, False]]   # tie: lower index
    assert sparse.topk_mask(s, 0.5).sum() == 3 and sparse.topk_mask(s, 1e-6).sum() == 1
    a = sparse.act_values(np.array([-1.0, 0.0, 2.0], np.float32), "silu")
    np.testing.assert_allclose(a, [-1 / (1 + np.e), 0, 2 / (1 + np.exp(-2))], rtol=1e-6)
    h = sparse.combine(np.array([[-1.0, 2.0]], np.float32), np.array([[3.0, -4.0]], np.float32), "drelu")
    assert h.tolist() == [[0.0, 0.0]]


def test_allocation_hits_mean_and_prefers_flat_layers():
    grid = np.array([0.1, 0.25, 0.5, 0.75, 1.0])
    steep = np.array([0.9, 0.6, 0.3, 0.1, 0.0])
    flat = np.array([0.2, 0.12, 0.06, 0.02, 0.0])
    bumpy = np.array([0.5, 0.45, 0.1, 0.08, 0.0])            # not convex: its hull is used
    err = np.stack([steep, flat, bumpy, flat * 0.5])
    for F in (0.1, 0.2, 0.35, 0.5, 0.7, 0.9, 1.0):
        k = ffn_rule.allocate_keep(err, grid, F)
        assert abs(k.mean() - F) < 1e-9 and np.all(k >= 0.1 - 1e-12) and np.all(k <= 1.0 + 1e-12)
    k = ffn_rule.allocate_keep(err, grid, 0.5)
    assert k[0] > k[1] > k[3] and k[0] > 0.5 > k[3]
    with pytest.raises(UsageError):
        ffn_rule.allocate_keep(err, grid, 0.05)
    t = ffn_rule.layer_thresholds(np.array([[0.5, 0.3, 0.2, 0.1, 0.0]]), grid, np.array([0.375]))
    assert t[0] == np.float32(0.25)


# ------------------------------------------------------------------ CLI

def test_cli_keep_and_dense_on_run(plain, pi2_files, tmp_path):
    base = cli("run", str(plain), "-p", "hello", "-n", "6", "--temp", "0", "--json")
    dense = cli("run", str(plain), "-p", "hello", "-n", "6", "--temp", "0", "--json", "--dense")
    half = cli("run", str(plain), "-p", "hello", "-n", "6", "--temp", "0", "--json", "--keep", "0.5")
    assert base.code == dense.code == half.code == 0, half.err
    assert json.loads(base.out)["tokens"] == json.loads(dense.out)["tokens"]
    res = cli("run", str(pi2_files["gud"]), "-p", "hello", "-n", "4", "--temp", "0")
    assert res.code == 0, res.err
    assert_error(cli("run", str(plain), "-p", "x", "--keep", "1.5"), 2, "keep")
    pwri = write_model(tmp_path / "s.powerinfer.gguf", pwri=True, wtype="F32", pred_rank=8)
    res = cli("run", str(pwri), "-p", "x", "-n", "2", "--engine", "c")      # PWRI files run in C (test_pwri_c.py)
    assert res.code == 0, res.err


def test_cli_keep_on_perplexity(plain, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text(TEXT * 2)
    ppl = {}
    for flags in ((), ("--dense",), ("--keep", "1.0"), ("--keep", "0.3"), ("--keep", "1.0", "--engine", "reference")):
        res = cli("perplexity", str(plain), "-f", str(text), "-c", "64", "--chunks", "2", *flags, timeout=120)
        assert res.code == 0, res.err
        ppl[flags] = float(re.search(r"PPL = (\S+)", res.out)[1])
    assert ppl[()] == ppl[("--dense",)] == ppl[("--keep", "1.0")] == ppl[("--keep", "1.0", "--engine", "reference")]
    assert ppl[("--keep", "0.3")] != ppl[()]


def test_cli_keep_on_bench(plain):
    def rec(*flags):
        res = cli("bench", str(plain), "-p", "0", "-n", "4", "-r", "1", "-o", "json", *flags, timeout=120)
        assert res.code == 0, res.err
        return json.loads(res.out)[0]
    dense, half = rec(), rec("--keep", "0.5")
    assert dense["pi2_ffn_keep"] == 1.0 and half["pi2_engine"] == "c"
    assert abs(half["pi2_ffn_keep"] - 0.5) < 0.01
    assert half["pi2_ffn_bytes_per_token"] < dense["pi2_ffn_bytes_per_token"]
    assert rec("--dense")["pi2_ffn_bytes_per_token"] == dense["pi2_ffn_bytes_per_token"]


# ------------------------------------------------------------------ SmolLM2

@pytest.mark.model
@pytest.mark.slow
def test_smollm2_perplexity_by_keep(tmp_path):
    import pydoc_data.topics as t
    path = model_file("smollm2-135m")
    text = tmp_path / "held.txt"
    text.write_text("".join(t.topics[k] for k in sorted(t.topics))[:60000])
    ppl = {}
    for keep in ("1.0", "0.7", "0.5"):
        res = cli("perplexity", str(path), "-f", str(text), "-c", "256", "--chunks", "2", "--keep", keep,
                  "--engine", "reference", timeout=900)
        assert res.code == 0, res.err
        ppl[keep] = float(re.search(r"PPL = (\S+)", res.out)[1])
    print("SmolLM2 perplexity by keep:", ppl)
    assert ppl["1.0"] < ppl["0.7"] < ppl["0.5"] < 2 * ppl["1.0"]
