"""test_ffn_predicted_c.py — the C engine's `predicted` FFN rule (csrc/ffn/predicted.c) against the numpy reference
(pi2/reference/sparse_ffn.py SparseFFN): bit-identical logits and the same statistics (keep, predicted share, bytes per token) for
low-bit (1 and 2 bits) and low-rank predictors reading ffn_norm(h) or the layer's attn_norm input, for prompt
batches and single tokens, for 1-3 threads; the rule with every neuron predicted is the threshold rule; the C
checks of predictor descriptors and parameters; `pi2 run` / `pi2 bench` on such files run in C by default; and on
SmolLM2, a converted file with a low-bit predictor through both engines."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from clirun import cli
from decode_seq import run
from conftest import model_file
from fixtures import write_model

from pi2 import engine
from pi2.reference import sparse_ffn as sparse
from pi2.convert import convert, predictor
from pi2.engine import CContext, CModel
from pi2.errors import EngineError, ModelFormatError, UnsupportedError
from pi2.model.loader import load_model
from pi2.reference.forward import ReferenceContext
from pi2.runtime import ffn_rule
from pi2.model import ffn_layout



def _convert(src, out, spec, calib_tokens=512):
    return convert(src, out, progress=False, pred=spec, calib_tokens=calib_tokens).output


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("cpred")
    src = write_model(d / "m.gguf", wtype="Q4_1", n_embd=96, n_ff=192, n_layer=2, seed=3)   # 96: odd block count
    return {"lowbit2": _convert(src, d / "lb2.pi2.gguf", predictor.Spec("lowbit", "ffn_norm", bits=2)),
            "lowbit1": _convert(src, d / "lb1.pi2.gguf", predictor.Spec("lowbit", "attn_input", bits=1)),
            "lowrank": _convert(src, d / "lr.pi2.gguf", predictor.Spec("lowrank", "attn_input", rank=32))}


@pytest.mark.parametrize("name", ["lowbit2", "lowbit1", "lowrank"])
def test_c_predicted_rule_equals_reference(files, name):
    m = load_model(files[name])
    spec = ffn_rule.choose_rule(m)
    assert spec.rule == "predicted"
    ref = ReferenceContext(m, 32)
    want, ref_stats = run(ref), ref.bench_stats()
    assert ref_stats["ffn_keep"] < ref_stats["ffn_predicted"] < 1.0    # P leaves neurons out; gate rows cut more
    for nt in (1, 2, 3):
        c = CContext(CModel.from_model(m), 32, nt)
        c.set_ffn(spec)
        assert np.array_equal(run(c), want), nt
        assert c.bench_stats() == ref_stats


def test_everything_predicted_is_the_threshold_rule(files):
    """With every cut below 0 (all neurons predicted), logits equal the threshold rule's; the bytes differ by the
    predictor's own bytes per token."""
    m = load_model(files["lowrank"])
    pred = ffn_rule.choose_rule(m)
    thr = ffn_rule.choose_rule(m, use_predictor=False)
    assert thr.rule == "threshold"
    ca, cb = CContext(CModel.from_model(m), 32, 2), CContext(CModel.from_model(m), 32, 2)
    ca.set_ffn(dataclasses.replace(pred, cuts=np.full(m.config.n_layer, -1.0, np.float32)))
    cb.set_ffn(thr)
    assert np.array_equal(run(ca), run(cb))
    sa, sb = ca.bench_stats(), cb.bench_stats()
    assert sa["ffn_keep"] == sb["ffn_keep"] and sa["ffn_predicted"] == 1.0
    pred_bytes = sum(ffn_layout.predictor_bytes(m, il, "lowrank") for il in range(m.config.n_layer))
    lr_bytes = sum(ffn_layout.layer_bytes(m, il)[0] for il in range(m.config.n_layer))   # fc1/fc2 counted there too
    assert sa["ffn_bytes_per_token"] - sb["ffn_bytes_per_token"] == pred_bytes - lr_bytes


def test_c_rejects_bad_predicted_parameters(files):
    m = load_model(files["lowbit2"])
    spec = ffn_rule.choose_rule(m)
    c = CContext(CModel.from_model(m), 32, 1)
    with pytest.raises(EngineError, match="no low-rank predictor"):
        c.set_ffn(dataclasses.replace(spec, pred_kind="lowrank"))
    thr = np.zeros(m.config.n_layer, np.float32)
    p = engine.ffi.new("pi2_ffn_params *", {"rule": 4, "score_up": 1, "keep": 1.0})   # set_ffn never sends it
    p.thresholds = p.pred_cuts = engine.ffi.from_buffer("float[]", thr)
    with pytest.raises(EngineError, match="act\\(gate\\)"):
        engine.check(engine.lib.pi2_ctx_set_ffn(c._h, p))
    p.score_up, p.pred_cuts = 0, engine.ffi.NULL
    with pytest.raises(EngineError, match="cut"):
        engine.check(engine.lib.pi2_ctx_set_ffn(c._h, p))
    c.set_ffn(spec)                                  # still usable after the refusals
    assert c.decode([1, 2]).shape == (m.config.n_vocab,)


def test_c_checks_predictor_descriptors(files):
    m = load_model(files["lowbit2"])
    descs = engine.tensor_descs(m)
    gp = [d for d in descs if d[0] == 21]
    assert len(gp) == m.config.n_layer and gp[0][2].type == 1002
    role, layer, v = gp[0]
    bad = engine.RowView(1003, v.ne, v.offset, v.nbytes, 0)                 # not a low-bit type id
    with pytest.raises(UnsupportedError, match="low-bit"):
        CModel.from_model(m, [d if d is not gp[0] else (role, layer, bad) for d in descs])
    bad = engine.RowView(1001, v.ne, v.offset, v.nbytes, 0)                 # 1 bit: the size says 2
    with pytest.raises(ModelFormatError, match="bytes"):
        CModel.from_model(m, [d if d is not gp[0] else (role, layer, bad) for d in descs])
    lr = load_model(files["lowrank"])
    descs = engine.tensor_descs(lr)
    assert sum(d[0] in (22, 23) for d in descs) == 2 * lr.config.n_layer
    with pytest.raises(ModelFormatError, match="fc1 .* and fc2"):        # fc1 without its fc2
        CModel.from_model(lr, [d for d in descs if not (d[0] == 23 and d[1] == 1)])


def test_cli_runs_predictor_files_in_c(files):
    path = files["lowbit1"]
    ref = cli("run", path, "-p", "hello", "-n", "6", "--temp", "0", "--json", "--engine", "reference", "--predictor")
    auto = cli("run", path, "-p", "hello", "-n", "6", "--temp", "0", "--json", "--predictor")
    assert ref.code == auto.code == 0, auto.err
    assert "reference" not in auto.err, auto.err
    assert json.loads(ref.out)["tokens"] == json.loads(auto.out)["tokens"]
    nop = cli("run", path, "-p", "hello", "-n", "3", "--temp", "0", "--no-predictor", "--engine", "c")
    assert nop.code == 0, nop.err
    recs = {}
    for eng in ("c", "reference"):
        res = cli("bench", path, "-p", "0", "-n", "4", "-r", "1", "--engine", eng, "-o", "json", "--predictor",
                  timeout=120)
        assert res.code == 0, res.err
        recs[eng] = json.loads(res.out)[0]
    assert recs["c"]["pi2_engine"] == "c"
    for k in ("pi2_ffn_bytes_per_token", "pi2_ffn_keep", "pi2_ffn_predicted"):
        assert recs["c"][k] == recs["reference"][k], k
    for flag in ("--no-predictor", None):       # off by default
        nop = cli("bench", path, "-p", "0", "-n", "4", "-r", "1", "-o", "json", *([flag] if flag else []), timeout=120)
        assert nop.code == 0, nop.err
        assert "pi2_ffn_predicted" not in json.loads(nop.out)[0]


def test_info_shows_the_predictor(files):
    lb = cli("info", files["lowbit1"])
    assert lb.code == 0, lb.err
    text = " ".join(lb.out.split())
    recall = load_model(files["lowbit1"]).file.kv["pi2.predictor.recall"]
    assert "lowbit (1-bit gate copy, input attn_input)" in text, text
    assert f"mean {float(np.mean(recall)):.3f}, min {float(np.min(recall)):.3f}" in text, text
    assert any(ln.split("│")[1].strip() == "predictor" for ln in lb.out.splitlines() if ln.count("│") > 2), lb.out
    lr = cli("info", files["lowrank"])
    assert lr.code == 0 and "lowrank (rank 32, input attn_input)" in " ".join(lr.out.split()), lr.out


@pytest.mark.model
@pytest.mark.slow
def test_smollm2_lowbit_predicted_c_equals_reference(tmp_path):
    """~/.cache/pi2/conv/smollm2-lowbit.pi2.gguf when it is there (`pi2 convert --predictor lowbit`), else made now."""
    path = Path.home() / ".cache" / "pi2" / "conv" / "smollm2-lowbit.pi2.gguf"
    if not path.exists():
        path = _convert(model_file("smollm2-135m"), tmp_path / "s.pi2.gguf", predictor.Spec("lowbit", bits=2),
                        calib_tokens=256)
    m = load_model(path)
    want = run(ReferenceContext(m, 32))
    c = CContext(CModel.from_model(m), 32, 2)
    c.set_ffn(ffn_rule.choose_rule(m))
    assert c.ffn_spec.rule == "predicted" and c.ffn_spec.pred_kind == "lowbit"
    assert np.array_equal(run(c), want)
    assert 0 < c.bench_stats()["ffn_predicted"] < 1.0
