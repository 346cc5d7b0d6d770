"""test_sample_c.py — the C top-k cut (csrc/sample.c, pi2.engine.sample.top_k) against its numpy specification
(pi2.runtime.sampling.top_k_order_np): the same ids in the same order and the same logits, on random rows, rows of
many ties, mostly -inf rows, sorted rows (every logit displaces one) and NaN; block edges around 32 logits."""
import numpy as np
import pytest

from pi2.engine import ffi, lib
from pi2.engine.sample import top_k
from pi2.runtime.sampling import top_k_order_np


def rows(rng):
    for n in (1, 2, 31, 32, 33, 63, 64, 65, 97, 1000, 4099, 49152):
        yield n, (rng.standard_normal(n) * 3).astype(np.float32)
        yield n, rng.integers(-3, 3, n).astype(np.float32)                   # ties everywhere, at the cut too
        x = rng.standard_normal(n).astype(np.float32)
        x[rng.random(n) < 0.8] = -np.inf
        yield n, x
        yield n, np.sort(rng.standard_normal(n)).astype(np.float32)          # ascending: each one enters
        yield n, np.sort(rng.standard_normal(n)).astype(np.float32)[::-1].copy()
        yield n, np.zeros(n, dtype=np.float32)


@pytest.mark.parametrize("k", [1, 2, 5, 31, 40, 64, 128])
def test_c_top_k_equals_numpy(k):
    rng = np.random.default_rng(k)
    for n, x in rows(rng):
        if k >= n:
            continue
        ids, vals = top_k(x, k)
        want = top_k_order_np(x, k)
        assert ids.tolist() == want.tolist(), (n, k)
        np.testing.assert_array_equal(vals, x[want])


def test_c_top_k_skips_nan():
    x = np.array([1.0, np.nan, 3.0, 2.0, np.nan, 0.5], dtype=np.float32)
    ids, vals = top_k(x, 3)
    assert ids.tolist() == [2, 3, 0] and vals.tolist() == [3.0, 2.0, 1.0]
    assert top_k(x, 5) is None          # only four numbers: the caller takes the numpy way


def test_c_top_k_rejects_bad_arguments():
    out_i, out_v = ffi.new("int32_t[4]"), ffi.new("float[4]")
    x = ffi.new("float[4]", [1, 2, 3, 4])
    assert lib.pi2_top_k(x, 4, 0, out_i, out_v) == lib.PI2_ERR_INVALID
    assert lib.pi2_top_k(x, -1, 2, out_i, out_v) == lib.PI2_ERR_INVALID
    assert lib.pi2_top_k(ffi.NULL, 4, 2, out_i, out_v) == lib.PI2_ERR_INVALID
    assert lib.pi2_top_k(x, 0, 2, out_i, out_v) == 0


def chains(rng):
    """Random logits rows for the default chain's shape: top-k 40 of a row, then what follows."""
    for i in range(300):
        n = int(rng.integers(50, 5000))
        x = (rng.standard_normal(n) * rng.uniform(0.5, 6)).astype(np.float32)
        if i % 3 == 0:
            x[rng.integers(0, n)] += np.float32(rng.uniform(2, 15))      # a confident token
        if i % 7 == 0:
            x[rng.random(n) < 0.5] = -np.inf
        yield x


@pytest.mark.parametrize("kw", [dict(), dict(top_p=0.5, min_p=0.2, temp=1.3), dict(top_k=100, top_p=0.99, min_p=0.0),
                                dict(top_k=7, min_keep=3, top_p=0.3, min_p=0.5), dict(samplers="top_k;min_p;top_p")])
def test_native_chain_draws_what_numpy_draws(monkeypatch, kw):
    """The chain with its C stages (top-k, top-p, min-p, dist) picks the token the numpy stages pick, step by step."""
    import pi2.runtime.sampling as sampling
    from pi2.runtime.config import SamplerParams
    rng = np.random.default_rng(7)
    for x in chains(rng):
        got = []
        for native in (True, False):
            monkeypatch.setattr(sampling, "NATIVE", native)
            s = sampling.Sampler(SamplerParams(seed=int(x.shape[0]), **kw), x.shape[0], 4096)
            got.append([s.sample(x) for _ in range(3)])
            ids, vals = s.candidates(x)
            got.append((ids.tolist(), vals.tolist()))
        assert got[0] == got[2] and got[1] == got[3]
