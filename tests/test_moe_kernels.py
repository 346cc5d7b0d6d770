"""test_moe_kernels.py — the products moe_matmul.py picks (F32/F16 vec_dot and tinyBLAS orders, repacked Q4_0,
Q5_K vec_dot and tiled) against float64 products of the same values, and which kernel each batch gets.
Bit-exactness against llama.cpp is tests/test_moe_oracle.py's job; these catch a wrong sum or a dropped term."""
import numpy as np
import pytest

from pi2.reference import fdot
from pi2.reference.kquant import quantize_q5_k
from pi2.reference.moe_matmul import ExpertLinear, Linear
from pi2.reference.quants import F16, F32, Q4_0, Q5_K, Q8_0, Q8_K, act_values, dequantize, quantize_act, quantize_weight

rng = np.random.default_rng(0)


def close(got, want, tol):
    want = np.asarray(want, np.float64)
    assert np.abs(got - want).max() <= tol * np.abs(want).max()


@pytest.mark.parametrize("k", [64, 200, 256])
def test_f32_orders(k):
    w = rng.standard_normal((12, k)).astype(np.float32)
    x = rng.standard_normal((5, k)).astype(np.float32)
    ref = x.astype(np.float64) @ w.T.astype(np.float64)
    close(fdot.dot_f32_vec(w, x), ref, 1e-6)
    if k % 16 == 0:
        close(fdot.dot_f32_tinyblas(w, x), ref, 1e-6)


def test_tinyblas_only_for_batches_of_whole_tiles():
    assert fdot.tinyblas_ok(2, 8, 64) and not fdot.tinyblas_ok(1, 8, 64)
    assert not fdot.tinyblas_ok(4, 6, 64) and not fdot.tinyblas_ok(4, 8, 40)


@pytest.mark.parametrize("qtype", [F32, F16, Q4_0, Q8_0])
@pytest.mark.parametrize("n_tok", [1, 3, 9])
def test_linear_matches_the_dequantized_product(qtype, n_tok):
    w = rng.standard_normal((16, 256)).astype(np.float32)
    raw = quantize_weight(w, qtype)
    lin = Linear(raw, qtype, 256)
    x = rng.standard_normal((n_tok, 256)).astype(np.float32)
    wd = dequantize(raw, qtype, 256).astype(np.float64)
    xv = x.astype(np.float16).astype(np.float64) if qtype == F16 else \
        act_values(quantize_act(x, 8), 8).astype(np.float64) if qtype in (Q4_0, Q8_0) else x.astype(np.float64)
    close(lin(x), xv @ wd.T, 1e-6)


@pytest.mark.parametrize("n_tok", [3, 8, 12])
def test_q5_k_experts_vec_and_tiled(n_tok):
    """Expert 1 of a 3-expert Q5_K tensor: vec_dot below 8 rows, tiled from 8; both the same value."""
    w = rng.standard_normal((3, 16, 512)).astype(np.float32)
    raw = quantize_q5_k(w.reshape(-1, 512))
    ex = ExpertLinear(raw, Q5_K, 512, 16, 3)
    x = rng.standard_normal((n_tok, 512)).astype(np.float32)
    wd = dequantize(ex.slice(1), Q5_K, 512).astype(np.float64)
    xv = act_values(quantize_act(x, Q8_K), Q8_K).astype(np.float64)
    close(ex(1, x), xv @ wd.T, 1e-5)
