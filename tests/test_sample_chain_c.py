"""test_sample_chain_c.py — the usual sampler chain in one C call (pi2_sample_top_k_chain, pi2.engine.sample.TopKChain,
taken by Sampler.sample for top-k then top-p / min-p / a plain temperature) against the numpy stages: the same token
for every seed and row, in any order of those stages, at temperature 0 and below, with min_keep, on rows with NaN
(the step-by-step way with the same draw); and which chains take it."""
import numpy as np
import pytest

import pi2.runtime.sampling as sampling
from pi2.engine import ffi, lib
from pi2.runtime.config import SamplerParams


def rows(rng):
    for i in range(120):
        n = int(rng.integers(50, 5000))
        x = (rng.standard_normal(n) * rng.uniform(0.5, 6)).astype(np.float32)
        if i % 3 == 0:
            x[rng.integers(0, n)] += np.float32(rng.uniform(2, 15))      # a confident token
        if i % 5 == 0:
            x[rng.integers(0, n, 8)] = np.float32(4.0)                    # ties
        if i % 7 == 0:
            x[rng.random(n) < 0.5] = -np.inf
        yield x


CHAINS = [dict(), dict(temp=0.8), dict(temp=0.0), dict(temp=-1.0), dict(top_k=1), dict(top_k=128, top_p=0.5),
          dict(top_p=1.0, min_p=0.0), dict(top_k=7, min_keep=3, top_p=0.3, min_p=0.5, temp=1.7),
          dict(samplers="top_k;temperature;min_p;top_p", temp=0.6), dict(samplers="top_k;min_p", min_p=0.2)]


def draws(monkeypatch, x, kw, way, n=4):
    """n tokens from row x by `way`: "one call", "stages" (the C stages one by one) or "numpy", and the RNG's next
    word after them."""
    monkeypatch.setattr(sampling, "NATIVE", way != "numpy")
    s = sampling.Sampler(SamplerParams(seed=int(x.shape[0]), **kw), x.shape[0], 4096)
    if way == "one call":
        k = min(s.params.top_k, x.shape[0])
        assert s._fused is not None or k >= x.shape[0]
    else:
        s._fused = None
    out = [s.sample(x) for _ in range(n)] + [s._rng_dist.next_u32()]
    if way == "one call" and s._fused is not None and not np.isnan(x).any():
        out.append(tuple(a.tolist() for a in s._fused.candidates()))    # what the stages left, bit for bit
    elif way != "one call" and not np.isnan(x).any():
        out.append(tuple(a.tolist() for a in s.candidates(x)))
    return out


@pytest.mark.parametrize("kw", CHAINS)
def test_one_call_draws_what_the_numpy_stages_draw(monkeypatch, kw):
    rng = np.random.default_rng(11)
    for x in rows(rng):
        want = draws(monkeypatch, x, kw, "numpy")
        got = draws(monkeypatch, x, kw, "one call")
        assert got == want or (len(got) == len(want) - 1 and got == want[:-1]), (x.shape[0], kw)   # k >= n: no call
        assert draws(monkeypatch, x, kw, "stages") == want, (x.shape[0], kw)


def test_nan_rows_take_the_stages_with_the_same_draw(monkeypatch):
    rng = np.random.default_rng(3)
    x = rng.standard_normal(300).astype(np.float32)
    x[5:] = np.nan                      # five numbers, k = 40: the C cut gives up, the stages decide
    assert draws(monkeypatch, x, {}, "one call", 6) == draws(monkeypatch, x, {}, "stages", 6)


@pytest.mark.parametrize("kw,fused", [(dict(), True), (dict(top_k=0), False), (dict(top_k=129), False),
                                      (dict(repeat_penalty=1.1), False), (dict(typ_p=0.9), False),
                                      (dict(dynatemp_range=0.5), False), (dict(mirostat=2), False),
                                      (dict(samplers="temperature;top_k"), False), (dict(xtc_probability=0.5), False),
                                      (dict(samplers="top_k;top_p"), True)])
def test_which_chains_take_one_call(kw, fused):
    assert (sampling.Sampler(SamplerParams(**kw), 1000, 4096)._fused is not None) == fused


def test_one_call_rejects_bad_arguments():
    x = ffi.new("float[4]", [1, 2, 3, 4])
    ids, vals, st, pa = ffi.new("int32_t[4]"), ffi.new("float[4]"), ffi.new("int32_t[1]", [99]), ffi.new("float[1]")
    left = ffi.new("int32_t *")
    call = lib.pi2_sample_top_k_chain
    assert call(x, 4, 2, st, pa, 1, 1, 0.5, ids, vals, left) == lib.PI2_ERR_INVALID   # an unknown stage
    assert call(x, 4, 0, st, pa, 0, 1, 0.5, ids, vals, left) == lib.PI2_ERR_INVALID
    assert call(ffi.NULL, 4, 2, st, pa, 0, 1, 0.5, ids, vals, left) == lib.PI2_ERR_INVALID
    assert call(x, 4, 2, ffi.NULL, ffi.NULL, 1, 1, 0.5, ids, vals, left) == lib.PI2_ERR_INVALID
    assert call(x, 4, 2, st, pa, 0, 1, 0.0, ids, vals, left) == 3 and left[0] == 2     # top-2, u = 0: the largest
    assert call(x, 4, 2, st, pa, 0, 1, 0.0, ids, vals, ffi.NULL) == 3
    assert call(x, 4, 5, st, pa, 0, 1, 0.5, ids, vals, left) == lib.PI2_SAMPLE_FEW
