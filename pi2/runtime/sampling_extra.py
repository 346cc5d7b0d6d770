"""sampling_extra.py — the stages of llama.cpp's sampler chain off its default path (top-k, top-p, min-p, a plain
temperature, which pi2/runtime/sampling.py holds): typical, top-n-sigma, XTC, dynamic temperature and mirostat 1 / 2,
each with llama.cpp's float32 arithmetic (src/llama-sampler.cpp). Each takes the candidates and SamplerParams, and the
generator or mirostat's mu it is handed.
Does not: decide whether a stage runs, in what order, or keep any state (sampling.py's Sampler); DRY
(sampling_dry.py).
"""
from __future__ import annotations

import numpy as np

from pi2.runtime.config import SamplerParams
from pi2.runtime.rng import Mt19937
from pi2.runtime.sampling_candidates import Candidates, seq_sum, softmax, temp

_F = np.float32


def typical(c: Candidates, p: SamplerParams) -> None:
    """llama_sampler_typical_apply: keep the tokens whose surprise is nearest the entropy, up to mass p."""
    if p.typ_p >= 1.0 or c.logits.shape[0] == 0:
        return
    softmax(c)
    logp = np.log(c.p)
    entropy = seq_sum((-c.p * logp).astype(np.float32))
    shifted = np.abs(-logp - entropy).astype(np.float32)
    order = np.argsort(shifted, kind="stable")
    cum = np.cumsum(c.p[order], dtype=np.float32)
    idx = np.arange(order.shape[0])
    ok = (cum > _F(p.typ_p)) & ((p.min_keep == 0) | (idx >= p.min_keep - 1))
    hit = np.flatnonzero(ok)
    c.take(order[: int(hit[0]) + 1 if hit.shape[0] else order.shape[0]], False)


def top_n_sigma(c: Candidates, p: SamplerParams) -> None:
    """llama_sampler_top_n_sigma_apply: logits below max - n * std (of the finite ones) become -inf."""
    n = _F(p.top_n_sigma)
    if n <= 0 or c.logits.shape[0] <= 1:
        return
    finite = c.logits[c.logits != -np.inf]
    mx = max(c.logits[0], finite.max()) if finite.shape[0] else c.logits[0]
    mean = _F(seq_sum(finite) / _F(finite.shape[0])) if finite.shape[0] else _F(0)
    acc = _F(np.sum(np.float64((finite - mean).astype(np.float32)) ** 2))
    std = _F(np.sqrt(acc / _F(finite.shape[0]))) if finite.shape[0] else _F(0)
    c.logits = np.where(c.logits < mx - n * std, _F(-np.inf), c.logits).astype(np.float32)


def xtc(c: Candidates, p: SamplerParams, rng: Mt19937) -> None:
    """llama_sample_xtc_apply: with probability p, drop every token above the threshold but the least likely. The
    caller runs it only when the stage is active (a probability above 0, a threshold up to 0.5)."""
    if c.logits.shape[0] < 2:
        return
    if rng.uniform_float() > _F(p.xtc_probability):
        return
    softmax(c)
    above = np.flatnonzero(c.p < _F(p.xtc_threshold))
    pos_last = (int(above[0]) if above.shape[0] else c.p.shape[0]) - 1
    if pos_last > 0 and c.p.shape[0] - pos_last >= p.min_keep:
        c.take(np.arange(pos_last, c.p.shape[0]), c.sorted)


def dynamic_temp(c: Candidates, p: SamplerParams) -> None:
    """llama_sampler_temp_ext_apply with --dynatemp-range > 0: a temperature from the normalised entropy."""
    if c.logits.shape[0] <= 1:
        return
    t, d = _F(p.temp), _F(p.dynatemp_range)
    lo, hi = max(_F(0), t - d), t + d
    max_entropy = -np.log(_F(1) / _F(c.logits.shape[0]))
    softmax(c)
    pp = c.p[c.p > 0]
    entropy = -seq_sum((pp * np.log(pp)).astype(np.float32))
    # llama.cpp's build contracts a + b * c into one fused multiply-add: one rounding, as in float64 here
    dyn = _F(np.float64(lo) + np.float64(hi - lo) * np.float64(np.power(_F(entropy / max_entropy),
                                                                         _F(p.dynatemp_exponent))))
    temp(c, dyn)
    e = np.exp(c.logits.astype(np.float64) - np.float64(c.logits[0]))
    c.p = (e / np.cumsum(e)[-1]).astype(np.float32)


def mirostat(c: Candidates, p: SamplerParams, n_vocab: int, mu, rng: Mt19937) -> tuple:
    """Mirostat 1 (m = 100) or 2 after the plain temperature: truncate by surprise, draw, adapt mu.
    Returns (token, the new mu)."""
    temp(c, p.temp)
    softmax(c)
    if p.mirostat == 1:
        m = min(99, c.p.shape[0] - 1)
        i = np.arange(m, dtype=np.float32)
        t = np.log((i + _F(2)) / (i + _F(1))).astype(np.float32)
        b = np.log(c.p[:m] / c.p[1:m + 1]).astype(np.float32)
        s_hat = seq_sum((t * b).astype(np.float32)) / seq_sum((t * t).astype(np.float32)) if m > 0 else _F(np.nan)
        eps = _F(s_hat - _F(1))
        k = np.power(_F(eps * np.power(_F(2), mu)) / _F(_F(1) - np.power(_F(n_vocab), -eps)),
                     _F(_F(1) / _F(s_hat)))
        kk = int(k) if np.isfinite(k) and -2**31 <= k < 2**31 else -2**31    # x86's int() of NaN / inf
        c.take(np.arange(min(max(kk, 1), c.p.shape[0])), True)
    else:
        over = np.flatnonzero(-np.log2(c.p) > mu)
        c.take(np.arange(max(int(over[0]) if over.shape[0] else c.p.shape[0], 1)), True)
    softmax(c)
    idx = rng.discrete(c.p)
    mu = _F(mu - _F(p.mirostat_eta) * _F(-np.log2(c.p[idx]) - _F(p.mirostat_tau)))
    return int(c.ids[idx]), mu
