"""test_ggml_order.py — pi2.reference.ggml_order and pi2.reference.qdot: ggml's x86 float order on hand-made cases (FMA rounding,
horizontal-sum order, ggml_v_expf, softmax) and the quantized kernels against scalar loops written here
from the kernels' structure (per-lane integer sums, one FMA per block, hsum_float_8)."""
import numpy as np
import pytest

from pi2.reference import ggml_order as go
from pi2.reference import qdot
from pi2.reference.quants import QuantLinear, quantize_act, quantize_weight

f32 = np.float32
EPS = 2.0 ** -23


def fma_scalar(a, b, c):
    return f32(float(a) * float(b) + float(c))      # float64 product of two float32 values is exact


def test_fma_rounds_once():
    a, b = f32(1 + EPS), f32(1 - EPS)
    assert f32(a * b) - f32(1) == 0                  # two roundings lose the tail
    assert go.fma32(a, b, f32(-1)) == f32(-(2.0 ** -46))


def test_hsum8_order():
    v = np.array([2.0 ** 24, 1, 1, 1, -(2.0 ** 24), 1, 1, 1], f32)[:, None]
    # (v4+v0, v5+v1, v6+v2, v7+v3) = (0, 2, 2, 2); (0+2, 2+2) = (2, 4); 2 + 4
    assert go.hsum8(v)[0] == 6
    seq = f32(0)
    for x in v[:, 0]:
        seq = f32(seq + x)
    assert seq != 6                                  # a sequential sum would lose the ones


def test_reduce16_order():
    v = np.zeros((16, 1), f32)
    v[0], v[8], v[1] = 2.0 ** 25, -(2.0 ** 25), 3
    assert go.reduce16(v)[0] == 3


def test_v_expf():
    assert go.v_expf(np.array([0.0], f32))[0] == 1
    x = np.linspace(-80, 80, 20001, dtype=f32)
    rel = np.abs(go.v_expf(x).astype(np.float64) / np.exp(x.astype(np.float64)) - 1)
    assert rel.max() < 4e-7
    assert go.v_expf(np.array([-np.inf, -200, 200], f32)).tolist() == [0, 0, np.inf]


def test_softmax_masked_rows():
    kq = np.array([[1.0, 2.0, 3.0, 4.0]], f32)
    p = go.softmax(kq, 0.5, np.array([[False, False, True, True]]))
    assert p[0, 2] == p[0, 3] == 0
    assert abs(p.sum() - 1) < 1e-6 and p[0, 1] > p[0, 0]


def test_f16_dots_are_exact_lane_sums():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((3, 64)).astype(np.float16).astype(f32)
    b = rng.standard_normal((2, 64)).astype(np.float16).astype(f32)
    tb, vd = go.dot_f16_tinyblas(a, b), go.dot_f16_vec(a, b)
    assert tb.shape == vd.shape == (2, 3)
    lanes = (b[:, None, :] * a[None, :, :]).reshape(2, 3, 4, 16).sum(axis=2, dtype=f32)   # exact products
    assert np.array_equal(tb, go.reduce16(np.moveaxis(lanes, -1, 0)))
    assert np.allclose(tb, vd, rtol=1e-6) and np.allclose(tb, b @ a.T, rtol=1e-5)


def scalar_q8_lanes(wq, wd, yq, yd, wm=None, ys=None):
    """One output of the AVX2 vec_dot, scalar by scalar: 8 lanes of 4 products, FMA per block, hsum_float_8."""
    acc = [f32(0)] * 8
    summs = f32(0)
    for b in range(len(wd)):
        dd = f32(wd[b] * yd[b])
        for lane in range(8):
            s = int(np.dot(wq[b, 4 * lane:4 * lane + 4].astype(np.int64), yq[b, 4 * lane:4 * lane + 4]))
            acc[lane] = fma_scalar(dd, f32(s), acc[lane])
        if wm is not None:
            summs = fma_scalar(wm[b], ys[b], summs)
    r = [f32(acc[i + 4] + acc[i]) for i in range(4)]
    r = [f32(r[0] + r[2]), f32(r[1] + r[3])]
    return f32(f32(r[0] + r[1]) + summs)


@pytest.mark.parametrize("t", [3, 6, 8])                 # Q4_1, Q5_0, Q8_0
def test_q8_lane_kernels_match_scalar_loop(t):
    rng = np.random.default_rng(t)
    w = rng.standard_normal((5, 128)).astype(f32)
    x = (rng.standard_normal((3, 128)) * np.exp(rng.standard_normal((3, 128)))).astype(f32)
    lin = QuantLinear.from_raw(quantize_weight(w, t), t, 128)
    got = lin(x)
    kw = lin._kernel_weights()
    act = quantize_act(x, lin.vdt)
    yd, yq = act[0].astype(f32), act[-1]
    for i in range(3):
        for r in range(5):
            want = scalar_q8_lanes(kw.q[:, :, r], kw.d[:, r], yq[i], yd[i],
                                   None if kw.m is None else kw.m[:, r],
                                   None if kw.m is None else act[1][i].astype(f32))
            assert got[i, r] == want, (i, r)


def test_q4_k_gemm_and_gemv_rows_differ_only_by_order():
    rng = np.random.default_rng(5)
    raw = rng.integers(0, 256, (8, 2, 144), dtype=np.uint8)
    raw[:, :, 0:4] = (rng.standard_normal((8, 2, 2)) * 0.01).astype(np.float16).view(np.uint8)
    lin = QuantLinear.from_raw(raw.reshape(8, -1), 12, 512)
    x = rng.standard_normal((5, 512)).astype(f32)
    full = lin(x)                                    # rows 0-3 GEMM, row 4 GEMV
    assert np.array_equal(full[4], lin(x[4:5])[0])   # a lone token takes the GEMV too
    alone = np.stack([lin(x[i:i + 1])[0] for i in range(4)])
    assert np.allclose(full[:4], alone, rtol=1e-5, atol=1e-3)
    act = quantize_act(x, lin.vdt)
    assert np.array_equal(qdot.dot_q4_k_repack(lin._kernel_weights(), act), full)
