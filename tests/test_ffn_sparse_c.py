"""test_ffn_sparse_c.py — the C sparse FFN (csrc/ffn/sparse.c) against the numpy reference (pi2/reference/sparse_ffn.py):
bit-identical logits for every rule (per-token top-F on plain files, calibrated thresholds and the dense rule on
pi2 files in both bundle layouts), for prompt batches and single-token decode, for any thread count;
the same active-neuron statistics; the C descriptors of bundle rows checked; `--engine c` with `--keep` on the CLI;
and on SmolLM2, a converted-style file through both engines."""
from __future__ import annotations

import json

import numpy as np
import pytest
from clirun import cli
from decode_seq import run
from fixtures import write_model
from pi2file import convert_pi2

from pi2 import engine
from pi2.reference import sparse_ffn as sparse
from pi2.engine import CContext, CModel
from pi2.engine.kernels import kernel_info
from pi2.errors import ModelFormatError
from pi2.model.loader import load_model
from pi2.reference.forward import ReferenceContext
from pi2.runtime import ffn_rule



def both(path, keep=None, dense=False, threads=((1, "auto"), (3, "auto")), repack=False, prefix=None):
    """Reference logits and stats, and the C engine's for each (thread count, kernel table), on a model whose
    matrices are repacked as `pi2 run` in memory does when repack (with prefix: each layer's dense prefix of up
    rows, pi2_model_ffn_prefix, first). (The other tables reproduce the auto kernels' sums only for axpy_group,
    which tests/c/kernel_selftest.c checks.)"""
    m = load_model(path)
    ref = ReferenceContext(m, 32, ffn_rule.choose_rule(m, keep, dense))
    want = run(ref)
    spec = ffn_rule.choose_rule(m, keep, dense)
    got = []
    for nt, impl in threads:
        cm = CModel.from_model(m)
        if prefix is not None:
            cm.ffn_prefix(prefix)
        if repack:
            cm.repack(ffn=True, impl=impl)
        c = CContext(cm, 32, nt, impl=impl)
        c.set_ffn(spec)
        got.append((run(c), c.bench_stats()))
    return want, ref.bench_stats(), got, spec


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("csp")
    plain = write_model(d / "plain.gguf", wtype="Q8_0", n_ff=320, n_embd=64)
    q4 = write_model(d / "q4.gguf", wtype="Q4_1", n_ff=320, n_embd=64, seed=2)
    odd = write_model(d / "odd.gguf", wtype="Q8_0", n_ff=256, n_embd=96, seed=4)   # 96 = 64 + a tail of 32
    # 608 columns: 19 blocks (16 + a tail of 3 in the packed kernel), 288 neurons (a short last group)
    wide = write_model(d / "wide.gguf", wtype="Q4_1", n_ff=288, n_embd=608, n_head=4, n_head_kv=2, seed=6)
    return {"plain": plain, "q4": q4, "f16": convert_pi2(odd, d / "f16.pi2.gguf", down_type="F16", default_keep=0.5),
            "odd_q8": convert_pi2(odd, d / "oq8.pi2.gguf", down_type="Q8_0", default_keep=0.5),
            "ud": convert_pi2(q4, d / "ud.pi2.gguf", down_type="Q5_1", default_keep=0.5),
            "ud4": convert_pi2(q4, d / "ud4.pi2.gguf", down_type="Q4_1", default_keep=0.5),
            "wide4": convert_pi2(wide, d / "wide4.pi2.gguf", down_type="Q4_1", default_keep=0.6),
            "wide5": convert_pi2(wide, d / "wide5.pi2.gguf", down_type="Q5_1", default_keep=0.6),
            "f32": convert_pi2(plain, d / "f32.pi2.gguf", down_type="F32", default_keep=0.75),
            "gud": convert_pi2(plain, d / "gud.pi2.gguf", layout="bundle-gud", down_type="Q8_0", default_keep=0.5)}


@pytest.mark.parametrize("name,keep,rule", [("plain", 0.5, "topk"), ("plain", 0.23, "topk"), ("q4", 0.35, "topk"),
                                            ("ud", None, "threshold"), ("ud", 0.3, "threshold"),
                                            ("ud4", None, "threshold"),
                                            ("f32", None, "threshold"), ("gud", None, "threshold"),
                                            ("gud", 1.0, "dense"), ("f16", None, "threshold"),
                                            ("odd_q8", None, "threshold")])
def test_c_sparse_ffn_equals_reference(files, name, keep, rule):
    want, ref_stats, got, spec = both(files[name], keep)
    assert spec.rule == rule
    for logits, stats in got:
        assert np.array_equal(logits, want)
        assert stats == ref_stats
    if rule != "dense":
        assert ref_stats["ffn_keep"] < 1.0


@pytest.mark.parametrize("name,keep", [("ud", None), ("ud4", None), ("ud4", 0.3), ("wide4", None), ("wide5", None),
                                       ("wide5", 0.25)])
def test_packed_down_rows_equal_reference(files, name, keep):
    """In memory, `pi2 run` repacks a pi2 file's Q4_1/Q5_1 down rows per group (ffn/down_pack.c) where the CPU has
    their kernel: one token's sums read that copy and give the reference's bits, prompt and decode, -t 1/2/3."""
    want, ref_stats, got, _ = both(files[name], keep, threads=((1, "auto"), (2, "auto"), (3, "auto")), repack=True)
    for logits, stats in got:
        assert np.array_equal(logits, want)
        assert stats == ref_stats
    m = load_model(files[name])
    plain = CModel.from_model(m).repack(ffn=False)
    packed = CModel.from_model(m).repack(ffn=True)
    if "avx512vnni" in kernel_info()["isa"]:   # the down rows' copy (the gate's too), else the gate's alone
        assert packed > plain + m.config.n_layer * m.config.n_ff * m.config.n_embd // 2


@pytest.mark.parametrize("name,keep", [("ud4", None), ("wide4", None), ("wide5", 0.25)])
def test_dense_prefix_of_up_rows_equals_reference(files, name, keep):
    """With a dense prefix (ffn/down_pack.c: a layer's first up rows in the x8 layout, computed whole with the gate
    rows) the logits stay the reference's: prefixes of no row, one 8-row group, part of a 64-neuron group, 70 rows
    (rounded down to 64) and every row, -t 1/2/3; the file's own prefix (ffn_rule.dense_prefix) too."""
    m = load_model(files[name])
    n_ff = m.config.n_ff
    picks = [[(0, 8, 72, 70, n_ff + 5)[(il + s) % 5] for il in range(m.config.n_layer)] for s in range(2)]
    own = ffn_rule.dense_prefix(m, ffn_rule.choose_rule(m, keep))
    assert len(own) == m.config.n_layer and all(0 <= n <= n_ff for n in own)
    for prefix in picks + [own]:
        want, ref_stats, got, _ = both(files[name], keep, threads=((1, "auto"), (2, "auto"), (3, "auto")), repack=True,
                                       prefix=prefix)
        for logits, stats in got:
            assert np.array_equal(logits, want)
            assert stats == ref_stats


def test_dense_prefix_bad_calls(files):
    cm = CModel.from_model(load_model(files["ud4"]))
    with pytest.raises(Exception):
        cm.ffn_prefix([8])   # not one count per layer
    cm.repack(ffn=True)
    if "avx512vnni" in kernel_info()["isa"]:   # the copies are made (no kernel elsewhere: no copies)
        with pytest.raises(Exception):
            cm.ffn_prefix([8] * cm.model.config.n_layer)   # after them


def test_dense_rule_on_bundles_and_plain(files):
    want, _, got, spec = both(files["ud"], dense=True, threads=((2, "auto"),))
    assert spec.rule == "dense" and np.array_equal(got[0][0], want)
    want, stats, got, _ = both(files["plain"], keep=1.0, threads=((1, "auto"),))
    assert np.array_equal(got[0][0], want) and got[0][1] == stats and stats["ffn_keep"] == 1.0


def test_score_up_rule(files):
    m = load_model(files["ud"])
    spec = ffn_rule.choose_rule(m, 0.5)
    spec.score = "act_up"
    ref = ReferenceContext(m, 32, ffn_rule.choose_rule(m, 0.5))
    ref.ffn.score = "act_up"
    c = CContext(CModel.from_model(m), 32, 2)
    c.set_ffn(spec)
    assert np.array_equal(run(c), run(ref))


def test_grouped_down_rows_order():
    """axpy_rows adds neurons within groups of GROUP in order, then the groups: check against a scalar loop."""
    rng = np.random.default_rng(0)
    n_ff, e = 200, 32
    rows = rng.normal(size=(n_ff, e)).astype(np.float32)
    from pi2.reference.quants import QuantLinear
    q = QuantLinear.from_raw(rows.view(np.uint8).reshape(n_ff, -1), 0, e)
    h = rng.normal(size=(1, n_ff)).astype(np.float32)
    h[0, rng.random(n_ff) < 0.6] = 0
    y = np.float32(0) * np.ones(e, np.float32)
    for g0 in range(0, n_ff, sparse.GROUP):
        nz = [i for i in range(g0, min(g0 + sparse.GROUP, n_ff)) if h[0, i] != 0]
        if not nz:
            continue
        p = np.zeros(e, np.float32)
        for i in nz:
            p = p + h[0, i] * rows[i]
        y = y + p
    assert np.array_equal(sparse.axpy_rows(h, q)[0], y)
    assert not np.array_equal(y, (h @ rows)[0])    # a different order than a BLAS product: the test can fail


def test_bundle_descriptors_checked(files):
    m = load_model(files["ud"])
    descs = engine.tensor_descs(m)
    down = [d for d in descs if d[0] == engine.ROLES["ffn_down_rows"]]
    assert len(down) == m.config.n_layer and all(d[2].row_stride > 0 for d in down)
    role, layer, v = down[0]
    bad = engine.RowView(v.type, v.ne, v.offset, v.nbytes, v.row_stride - 4)    # stride and size disagree
    with pytest.raises(ModelFormatError, match="bytes"):
        CModel.from_model(m, [d if d is not down[0] else (role, layer, bad) for d in descs])
    bad = engine.RowView(v.type, v.ne, v.offset, v.nbytes, 2)                    # stride below a row
    with pytest.raises(ModelFormatError, match="stride"):
        CModel.from_model(m, [d if d is not down[0] else (role, layer, bad) for d in descs])
    both_down = descs + [(18, 0, engine.RowView(v.type, (m.config.n_ff, m.config.n_embd), v.offset, 0, 0))]
    with pytest.raises(ModelFormatError):
        CModel.from_model(m, both_down)


def test_cli_c_engine_sparse(files):
    base = cli("run", str(files["plain"]), "-p", "hello", "-n", "6", "--temp", "0", "--json", "--keep", "0.5",
               "--engine", "reference")
    c = cli("run", str(files["plain"]), "-p", "hello", "-n", "6", "--temp", "0", "--json", "--keep", "0.5",
            "--engine", "c")
    assert base.code == c.code == 0, c.err
    assert json.loads(base.out)["tokens"] == json.loads(c.out)["tokens"]
    auto = cli("run", str(files["gud"]), "-p", "hello", "-n", "4", "--temp", "0")
    assert auto.code == 0 and "reference" not in auto.err, auto.err
    res = cli("bench", str(files["gud"]), "-p", "0", "-n", "4", "-r", "1", "-o", "json", timeout=120)
    assert res.code == 0, res.err
    rec = json.loads(res.out)[0]
    assert rec["pi2_engine"] == "c" and 0 < rec["pi2_ffn_keep"] < 1.0
