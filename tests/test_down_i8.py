"""test_down_i8.py — int8 down rows (`--ffn-type i8`): the reference's integer group sum (pi2/reference/down_i8.py)
against a scalar model of its definition and against the exact float sum; the converter's I8 rows and scales;
the C engine equal to the reference bit for bit (batches and single tokens, 1 and 3 threads; streamed bundles
in tests/test_stream_cache.py); the checks on the scales in the C descriptors; the CLI."""
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
from pi2.convert import layout
from pi2.reference.down_i8 import I8Rows, axpy_rows_i8, group_part
from pi2.engine import CContext, CModel
from pi2.errors import ModelFormatError
from pi2.model.loader import load_model
from pi2.reference.forward import ReferenceContext
from pi2.runtime import ffn_rule

def scalar_part(p, q):
    """The definition, one value at a time in float32 (numpy scalars) and Python integers."""
    m = np.float32(0)
    for v in p:
        m = max(m, np.float32(abs(v)))
    if not (np.float32(1e-30) <= m <= np.finfo(np.float32).max):
        return None
    inv, s = np.float32(32767) / m, m / np.float32(32767)
    z = [int(np.rint(np.float32(v) * inv)) for v in p]
    assert all(abs(v) <= 32767 for v in z)
    return np.array([s * np.float32(sum(z[i] * int(q[i, j]) for i in range(len(z)))) for j in range(q.shape[1])],
                    np.float32)


def test_group_part_is_its_definition():
    rng = np.random.default_rng(1)
    for k in (1, 3, 7, 64):
        q = rng.integers(-127, 128, size=(k, 40)).astype(np.int8)
        p = (rng.normal(size=k) * 10.0 ** rng.uniform(-3, 1, size=k)).astype(np.float32)
        p[0] = 0
        want = scalar_part(p, q)
        got = group_part(p, q)
        assert (want is None) == (got is None) and (want is None or np.array_equal(got, want))
    assert group_part(np.zeros(5, np.float32), np.ones((5, 8), np.int8)) is None


def test_i8_sum_close_to_float_sum():
    """The 16-bit z costs almost nothing against the exact float sum of the same int8 rows, groups as in the engine."""
    rng = np.random.default_rng(2)
    n_ff, e = 300, 96
    x = rng.normal(size=(n_ff, e)).astype(np.float32)
    q, sc, col = layout.encode_i8(x)
    assert np.abs(q).max() <= 127 and np.allclose(q * sc[:, None] * col, x, atol=float((sc[:, None] * col).max()))
    rows = I8Rows(q, sc, col)
    h = rng.normal(size=(3, n_ff)).astype(np.float32)
    h[rng.random(h.shape) < 0.4] = 0
    got = axpy_rows_i8(h, rows, sparse.GROUP)
    exact = h.astype(np.float64) @ rows.values().astype(np.float64)
    rel = np.linalg.norm(got - exact) / np.linalg.norm(exact)
    assert 0 < rel < 1e-4


def both(path, keep=None, threads=(1, 3)):
    m = load_model(path)
    ref = ReferenceContext(m, 32, ffn_rule.choose_rule(m, keep))
    want = run(ref)
    spec = ffn_rule.choose_rule(m, keep, False)
    got = []
    for nt in threads:
        c = CContext(CModel.from_model(m), 32, nt)
        c.set_ffn(spec)
        got.append((run(c), c.bench_stats()))
    return want, ref.bench_stats(), got


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("i8")
    plain = write_model(d / "plain.gguf", wtype="Q8_0", n_ff=320, n_embd=64)
    odd = write_model(d / "odd.gguf", wtype="Q4_1", n_ff=256, n_embd=96, seed=4)   # 96: a column tail
    return {"i8": convert_pi2(plain, d / "i8.pi2.gguf", down_type="I8", default_keep=0.5),
            "odd": convert_pi2(odd, d / "odd.pi2.gguf", down_type="I8", default_keep=0.75),
            "gud": convert_pi2(plain, d / "gud.pi2.gguf", layout="bundle-gud", down_type="I8", default_keep=0.5)}


@pytest.mark.parametrize("name,keep", [("i8", None), ("i8", 1.0), ("odd", None), ("odd", 0.3), ("gud", None)])
def test_c_equals_reference(files, name, keep):
    want, ref_stats, got = both(files[name], keep)
    for logits, stats in got:
        assert np.array_equal(logits, want)
        assert stats == ref_stats


def test_reference_reads_i8_rows(files):
    m = load_model(files["i8"])
    L = sparse.ffn_weights(m, 0)
    assert isinstance(L["down_rows"], I8Rows) and L["down_rows"].scale.shape == (m.config.n_ff,)


def test_scale_descriptor_checked(files, tmp_path):
    m = load_model(files["i8"])
    descs = engine.tensor_descs(m)
    scales = [d for d in descs if d[0] == engine.ROLES["ffn_down_scale"]]
    assert len(scales) == m.config.n_layer
    cols = [d for d in descs if d[0] == engine.ROLES["ffn_down_colscale"]]
    assert len(cols) == m.config.n_layer
    with pytest.raises(ModelFormatError, match="colscale"):
        CModel.from_model(m, [d for d in descs if d is not cols[0]])
    with pytest.raises(ModelFormatError, match="need ffn_down_scale and ffn_down_colscale"):
        CModel.from_model(m, [d for d in descs if d is not scales[1]])
    q8 = load_model(convert_pi2(write_model(tmp_path / "p.gguf", wtype="Q8_0", n_ff=320, n_embd=64),
                              tmp_path / "q8.pi2.gguf", down_type="Q8_0"))
    with pytest.raises(ModelFormatError, match="without int8"):     # a scale beside Q8_0 rows
        CModel.from_model(q8, engine.tensor_descs(q8) + [scales[0]])


def test_cli_run(files):
    """The CLI runs I8 files in C, with the reference's tokens."""
    args = ("-p", "hello there", "-n", "6", "--temp", "0", "--json")
    ref = cli("run", str(files["i8"]), *args, "--engine", "reference")
    c = cli("run", str(files["i8"]), *args)
    assert ref.code == c.code == 0, c.err
    assert json.loads(ref.out)["tokens"] == json.loads(c.out)["tokens"]
    res = cli("bench", str(files["i8"]), "-p", "0", "-n", "4", "-r", "1", "-o", "json", timeout=120)
    assert res.code == 0, res.err
    assert json.loads(res.out)[0]["pi2_engine"] == "c"


def test_convert_writes_i8_rows(tmp_path):
    """`pi2 convert --ffn-type i8`: I8 rows with both scale tensors, a small stored error, C equal to the reference."""
    from pi2.convert import convert
    src = write_model(tmp_path / "m.gguf", wtype="Q8_0", n_ff=192, n_embd=64, seed=3)
    rep = convert(src, tmp_path / "m.pi2.gguf", progress=False, ffn_type="i8", calib_tokens=64)
    assert set(rep.down_types) == {"I8"} and 0 < max(rep.down_err) < 0.02
    m = load_model(rep.output)
    L = sparse.ffn_weights(m, 1)
    assert isinstance(L["down_rows"], I8Rows) and L["down_rows"].colscale.shape == (64,)
    want, _, got = both(rep.output, threads=(2,))
    assert np.array_equal(got[0][0], want)
