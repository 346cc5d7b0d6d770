"""test_pwri_c.py — PowerInfer `PWRI` files on the C engine (csrc/ffn/pwri.c, the PI2_FFN_PWRI_PREDICTOR rule) against
the numpy reference (pi2/reference/sparse_ffn.py, rule `predictor`): the predictor fc2·relu(fc1·h) on the residual before ffn_norm,
active = score >= powerinfer.sparse_threshold, ReGLU (`llama`) or dReLU (`bamboo`), down as rows of ffn_down_t.
Checks: bit-identical logits and the same active count and bytes per token for prompt batches and single tokens at
-t 1 and -t 2, for the weight types whose products the reference computes in the kernels' float order; a threshold
equal to a score keeps that neuron (>=); dReLU really differs from ReGLU; bamboo's dense GGUF and pi2 files converted
from PWRI files (mapped and streamed); `pi2 run / bench / perplexity` run PWRI files in C by default with the
reference's tokens, statistics and perplexity; a PWRI file missing one fc2 ends with a one-line error.
F16 and Q4_0 (the types of PowerInfer's published files): the reference multiplies them by one BLAS product
(pi2/reference/quants.py QuantLinear, not in _EXACT), whose summation order no C kernel follows, so from the first matrix
product on the engines agree only to rounding: logits to NMSE_LOGITS with the same argmax (as tests/test_forward_c.py),
keep to KEEP_TOL (a score within rounding of the threshold may flip a neuron)."""
from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
import pytest
from clirun import assert_error, cli, patched, tensor_info
from decode_seq import TOKENS, run
from fixtures import TEXT, write_model

from pi2.reference import sparse_ffn as sparse
from pi2.convert import convert
from pi2.engine import CContext, CModel, stream_sizes, tensor_descs
from pi2.errors import EngineError, ModelFormatError
from pi2.model.loader import load_model
from pi2.reference.forward import ReferenceContext
from pi2.runtime import ffn_rule

EXACT = ("Q8_0", "Q4_1", "Q5_0")     # quants._EXACT: the reference follows the kernels' float order
ROUNDED = ("F16", "Q4_0")
NMSE_LOGITS = 1e-3
KEEP_TOL = 0.005


def nmse(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(((a - b) ** 2).sum() / max((a ** 2).sum(), 1e-30))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """PWRI files per (arch, weight type): n_ff 192 (three down-row groups); exact types with a rank-8 predictor
    (it misses and adds neurons, unlike the full-rank one, which nearly reproduces gate > 0)."""
    d = tmp_path_factory.mktemp("pwri")
    out = {}
    for arch in ("llama", "bamboo"):
        for wt in EXACT + ROUNDED:
            out[arch, wt] = write_model(d / f"{arch}-{wt}.gguf", arch, pwri=True, wtype=wt, n_ff=192, seed=5,
                                        pred_rank=8 if wt in EXACT else None)
    return out


def c_ctx(m, threads, spec=None):
    c = CContext(CModel.from_model(m), 32, threads)
    c.set_ffn(spec or ffn_rule.choose_rule(m))
    return c


@pytest.mark.parametrize("wtype", EXACT)
@pytest.mark.parametrize("arch", ["llama", "bamboo"])
def test_c_equals_reference(files, arch, wtype):
    m = load_model(files[arch, wtype])
    assert m.config.sparse and m.config.ffn_act == ("drelu" if arch == "bamboo" else "relu")
    ref = ReferenceContext(m, 32)
    assert ref.ffn.rule == "predictor"
    want, ref_stats = run(ref), ref.bench_stats()
    assert 0.2 < ref_stats["ffn_keep"] < 0.8                       # the predictor really drops neurons
    for nt in (1, 2):
        c = c_ctx(m, nt)
        assert np.array_equal(run(c), want), nt
        assert c.bench_stats() == ref_stats, nt
        assert c.ffn_counts()[1].sum() == ref.ffn.n_active


@pytest.mark.parametrize("wtype", ROUNDED)
@pytest.mark.parametrize("arch", ["llama", "bamboo"])
def test_c_agrees_with_reference_to_rounding(files, arch, wtype):
    m = load_model(files[arch, wtype])
    ref = ReferenceContext(m, 32)
    want, ref_stats = run(ref), ref.bench_stats()
    got = [run(c) for c in (c_ctx(m, 1), c_ctx(m, 2))]
    assert np.array_equal(got[0], got[1])                          # any thread count: bit for bit
    assert nmse(want, got[0]) <= NMSE_LOGITS and (want.argmax(-1) == got[0].argmax(-1)).all()
    c = c_ctx(m, 2)
    run(c)
    assert abs(c.bench_stats()["ffn_keep"] - ref_stats["ffn_keep"]) <= KEEP_TOL


def test_threshold_equal_to_a_score_keeps_the_neuron(files):
    """With the threshold set to one of layer 0's scores, that neuron is active (score >= threshold) in both
    engines; under `>` the count would drop."""
    m = load_model(files["llama", "Q8_0"])
    ref = ReferenceContext(m, 32)
    h = {}
    ref.trace = lambda name, il, t: h.setdefault(il, t) if name == "ffn_inp" else None
    ref.decode(TOKENS[:8])
    L = ref.w.layers[0]
    scores = sparse.predictor_scores(h[0], L["fc1"], L["fc2"])
    thr = float(np.sort(scores[3])[100])                           # a value token 3 really scores
    assert (scores >= np.float32(thr)).sum() > (scores > np.float32(thr)).sum()
    spec = dataclasses.replace(ffn_rule.choose_rule(m), threshold=thr)
    c = c_ctx(m, 2, spec)
    c.decode(TOKENS[:8])
    assert c.ffn_counts()[1][0] == (scores >= np.float32(thr)).sum()
    ref = ReferenceContext(m, 32)
    ref.ffn.threshold = thr
    c = c_ctx(m, 1, spec)
    assert np.array_equal(run(c), run(ref))
    assert c.ffn_counts()[1].sum() == ref.ffn.n_active


def test_drelu_is_not_reglu(files):
    """The bamboo and llama files hold the same weights; only the activation differs, and so do the logits."""
    lm, bm = load_model(files["llama", "Q8_0"]), load_model(files["bamboo", "Q8_0"])
    for name in ("blk.0.ffn_up.weight", "blk.1.fc2.weight"):
        assert np.array_equal(lm.raw(name), bm.raw(name))
    a, b = run(c_ctx(lm, 2)), run(c_ctx(bm, 2))
    assert nmse(a, b) > 1e-4


@pytest.mark.parametrize("arch", ["llama", "bamboo"])
def test_dense_flag(files, arch):
    """--dense on a PWRI file: every neuron, down still as ffn_down_t rows."""
    m = load_model(files[arch, "Q8_0"])
    ref = ReferenceContext(m, 32, ffn_rule.choose_rule(m, dense=True))
    want = run(ref)
    c = c_ctx(m, 2, ffn_rule.choose_rule(m, dense=True))
    assert c.ffn_spec.rule == "dense"
    assert np.array_equal(run(c), want) and c.bench_stats() == ref.bench_stats()


def test_bamboo_gguf_is_relu_gated(tmp_path):
    """A bamboo file with the GGUF magic: the dense ReLU-gated FFN (ffn_down), or the ReLU rule with --keep."""
    m = load_model(write_model(tmp_path / "b.gguf", "bamboo", wtype="Q8_0", n_ff=192))
    assert not m.config.sparse and m.config.ffn_act == "relu"
    for keep in (None, 0.5):
        ref = ReferenceContext(m, 32, ffn_rule.choose_rule(m, keep))
        want = run(ref)
        c = c_ctx(m, 2, ffn_rule.choose_rule(m, keep))
        assert np.array_equal(run(c), want) and c.bench_stats() == ref.bench_stats(), keep


@pytest.mark.parametrize("arch", ["llama", "bamboo"])
def test_pi2_file_from_pwri(files, tmp_path, arch):
    """A pi2 file converted from a PWRI file keeps the predictor rule: C equals the reference, mapped and streamed
    (a cache of one layer's clusters, no hot prefix)."""
    out = convert(files[arch, "Q8_0"], tmp_path / "p.pi2.gguf", progress=False, calib_tokens=256).output
    m = load_model(out)
    assert m.config.pi2 and m.config.sparse
    ref = ReferenceContext(m, 32)
    want = run(ref)
    c = c_ctx(m, 2)
    assert c.ffn_spec.rule == "predictor"
    assert np.array_equal(run(c), want) and c.bench_stats() == ref.bench_stats()
    s = c_ctx(m, 2)
    s.set_stream(cluster=16, n_slots=stream_sizes(s.cmodel, 16)["min_slots"], io="pread")
    assert np.array_equal(run(s), want)
    assert s.cache_stats()["misses"] > 0


def test_c_refuses_a_missing_predictor(files):
    m = load_model(files["llama", "Q8_0"])
    descs = tensor_descs(m)
    assert sum(d[0] in (22, 23) for d in descs) == 2 * m.config.n_layer
    assert sum(d[0] == 20 for d in descs) == m.config.n_layer and not any(d[0] == 18 for d in descs)
    with pytest.raises(ModelFormatError, match="fc1 .* and fc2"):                     # fc1 without its fc2
        CModel.from_model(m, [d for d in descs if not (d[0] == 23 and d[1] == 1)])
    cm = CModel.from_model(m, [d for d in descs if not (d[0] in (22, 23) and d[1] == 1)])
    c = CContext(cm, 32, 1)
    with pytest.raises(EngineError, match="layer 1 has no predictor"):
        c.set_ffn(ffn_rule.choose_rule(m))
    c = c_ctx(m, 1)
    with pytest.raises(EngineError, match="score"):
        c.set_ffn(dataclasses.replace(ffn_rule.choose_rule(m), score="act_up"))
    assert np.array_equal(c.decode([1, 2]), ReferenceContext(m, 32).decode([1, 2]))   # still usable


# ---------------------------------------------------------------- the CLI

@pytest.mark.parametrize("arch", ["llama", "bamboo"])
def test_cli_run_uses_c(files, arch):
    path = files[arch, "Q8_0"]
    args = ("run", path, "-p", "The quick brown fox", "-n", "6", "--temp", "0", "--json")
    auto, ref, c = cli(*args), cli(*args, "--engine", "reference"), cli(*args, "--engine", "c", "-t", "1")
    assert auto.code == ref.code == c.code == 0, auto.err + ref.err + c.err
    assert "reference" not in auto.err and "note" not in auto.err, auto.err
    assert json.loads(auto.out)["tokens"] == json.loads(ref.out)["tokens"] == json.loads(c.out)["tokens"]


def test_cli_bench_reports_the_sparse_ffn(files):
    recs = {}
    for eng in ("auto", "reference"):
        res = cli("bench", files["bamboo", "Q8_0"], "-p", "4", "-n", "4", "-r", "1", "--engine", eng, "-o", "json",
                  timeout=120)
        assert res.code == 0, res.err
        recs[eng] = json.loads(res.out)
    assert [r["pi2_engine"] for r in recs["auto"]] == ["c", "c"]
    for a, b in zip(recs["auto"], recs["reference"]):
        for k in ("pi2_ffn_keep", "pi2_ffn_bytes_per_token"):
            assert a[k] == b[k], k
        assert 0.2 < a["pi2_ffn_keep"] < 0.8


def test_cli_perplexity(files, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text(TEXT)
    ppl = {}
    for eng in ("auto", "reference"):
        res = cli("perplexity", files["llama", "Q8_0"], "-f", text, "-c", "32", "--chunks", "2", "--engine", eng,
                  timeout=120)
        assert res.code == 0, res.err
        ppl[eng] = float(re.search(r"PPL = (\S+)", res.out)[1])
        assert eng == "reference" or "reference" not in res.err, res.err
    assert ppl["auto"] == ppl["reference"]


def test_cli_missing_fc2_is_one_line(files, tmp_path):
    src = files["llama", "Q8_0"]
    at = tensor_info(src.read_bytes(), "blk.1.fc2.weight")["name"]
    bad = patched(src, tmp_path / "bad.gguf", [(at, b"blk.1.fc9.weight")])
    for engine in ("auto", "c"):
        assert_error(cli("run", bad, "-p", "x", "-n", "1", "--engine", engine), 1, "blk.1.fc2.weight")
