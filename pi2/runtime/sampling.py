"""sampling.py — llama.cpp's sampler chain in numpy: the stages of `--samplers` (penalties, dry, top_n_sigma, top_k,
typ_p, top_p, min_p, xtc, temperature) in the order given, then a seeded draw (dist), or temp then mirostat 1 / 2.

Semantics and float32 arithmetic follow llama.cpp's src/llama-sampler.cpp and the chain common/sampling.cpp builds
from the same parameters: candidate order, when a stage sorts, "?name" for stages that do nothing, the banner. The
draws use std::mt19937 and libstdc++'s distributions (pi2/runtime/rng.py), so a seed gives llama.cpp's tokens on
the same logits (tests/test_samplers_llamacpp.py checks this against libllama's output). No numpy warning reaches
the terminal: -inf logits and zero probabilities are expected.
Owns: the Sampler (which stages run and in what order, the history, the seeds, the banner), the penalties, the stages
of llama.cpp's default chain (top-k, top-p, min-p, temperature; one C call for the usual chain) and the draw.
Does not: the other stages (typical, top-n-sigma, XTC, dynamic temperature, mirostat: pi2/runtime/sampling_extra.py),
DRY (pi2/runtime/sampling_dry.py), the candidates and their softmax (pi2/runtime/sampling_candidates.py).
"""
from __future__ import annotations

import os
from collections import deque

import numpy as np

from pi2.engine import sample as _c
from pi2.errors import UsageError
from pi2.runtime.config import SamplerParams
from pi2.runtime.rng import Mt19937
from pi2.runtime.sampling_candidates import Candidates, descending, softmax, temp
from pi2.runtime.sampling_dry import Dry, breaker_sequences
from pi2.runtime.sampling_extra import dynamic_temp, mirostat, top_n_sigma, typical, xtc

LLAMA_DEFAULT_SEED = 0xFFFFFFFF  # a seed of -1 wraps to this; both mean "pick a random seed"
_TOP_P_GUESS, _TOP_P_GUESS_MIN_SIZE = 256, 1024   # top-p on unsorted candidates: the 256 most likely first
_F = np.float32
_TOP_K_GROUPS = 64      # top-k of a large vocabulary: the maxima of columns of this many rows bound the cut first
NATIVE = True           # False: every stage in numpy (the specification the C stages are tested against)
_C_TOP_K_MAX = 128      # k up to this: the C cut (csrc/sample.c, insertion into k sorted: cheap for a small k only)


def resolve_seed(seed: int) -> int:
    """llama.cpp's get_rng_seed: -1 / LLAMA_DEFAULT_SEED -> a random 32-bit seed, else the seed as uint32."""
    s = int(seed) & 0xFFFFFFFF
    if s == LLAMA_DEFAULT_SEED:
        return int.from_bytes(os.urandom(4), "little")
    return s


def _top_k_order(logits: np.ndarray, k: int) -> np.ndarray:
    """Indices of exactly k largest logits, sorted descending; ties at the cut go to the lowest index (llama.cpp's
    std::partial_sort leaves that choice unspecified). A small k takes the C cut, which equals top_k_order_np."""
    if NATIVE and k <= _C_TOP_K_MAX and k < logits.shape[0]:
        got = _c.top_k(logits, k)
        if got is not None:
            return got[0]
    return top_k_order_np(logits, k)


def top_k_order_np(logits: np.ndarray, k: int) -> np.ndarray:
    """_top_k_order in numpy: the specification of the C cut (pi2.engine.sample.top_k)."""
    n = logits.shape[0]
    if k >= n:
        return descending(logits)
    w = n // _TOP_K_GROUPS
    if w >= 4 * k:
        # the maxima of _TOP_K_GROUPS-strided columns: k of them are at least their k-th largest, so the k largest
        # logits (ties at the cut included) are all at or above it. On a real model's logits that leaves about k
        # candidates, and the exact selection runs on those only (a full-vocabulary argpartition costs ~1 ms).
        cols = logits[:w * _TOP_K_GROUPS].reshape(_TOP_K_GROUPS, w).max(axis=0)
        floor = np.partition(cols, w - k)[w - k]
        cand = np.flatnonzero(logits >= floor)
        if cand.shape[0] <= n // 2:      # (a vocabulary of mostly equal logits takes the direct way)
            return cand[top_k_order_np(logits[cand], k)]
    part = np.argpartition(logits, n - k)[n - k:]
    thr = logits[part].min()
    if int(np.count_nonzero(logits[part] == thr)) != int(np.count_nonzero(logits == thr)):
        above = np.flatnonzero(logits > thr)
        part = np.concatenate([above, np.flatnonzero(logits == thr)[: k - above.shape[0]]])
    else:
        part.sort()
    return part[descending(logits[part])]


class Sampler:
    """llama-completion's sampler chain over one vocabulary.

    accept() every token the context sees, prompt tokens included (llama-completion pushes the prompt into the
    sampler so the penalties cover it), then sample() the next token from a row of logits. `tokenizer` is needed
    only for DRY's sequence breakers (text to tokens)."""

    def __init__(self, params: SamplerParams, n_vocab: int, n_ctx: int, tokenizer=None):
        if n_vocab <= 0:
            raise UsageError(f"sampler needs a positive vocabulary size, got {n_vocab}")
        self.params, self.n_vocab, self.n_ctx = params, n_vocab, n_ctx
        # common_init_from_params turns -1 into the context size before the chain is built
        self.repeat_last_n = n_ctx if params.repeat_last_n == -1 else params.repeat_last_n
        self.dry_last_n = n_ctx if params.dry_penalty_last_n == -1 else params.dry_penalty_last_n
        self._prev: deque = deque()
        self._count: dict = {}
        self._repeat, self._freq, self._present = _F(params.repeat_penalty), _F(params.frequency_penalty), \
            _F(params.presence_penalty)
        self._dry = None
        if self.dry_active:
            brk = breaker_sequences(tokenizer, params.dry_sequence_breakers) if tokenizer is not None else {}
            self._dry = Dry(params.dry_multiplier, params.dry_base, params.dry_allowed_length, self.dry_last_n, brk)
        # the stages that do anything, in order (temperature always: dividing by 1 changes nothing either way)
        self._chain = [s for s in params.samplers if s == "temperature" or self._active(s)]
        self._fused = self._fused_chain()
        self.reset(history=False)

    def _fused_chain(self):
        """The chain as one C call (pi2.engine.sample.TopKChain) when it is top-k then only top-p, min-p and a plain
        temperature (llama.cpp's default chain is, its no-op stages left out); None otherwise."""
        p, chain = self.params, self._chain
        k = min(p.top_k, self.n_vocab)
        if p.mirostat or not chain or chain[0] != "top_k" or not (k <= _C_TOP_K_MAX and k < self.n_vocab):
            return None
        value = {"top_p": p.top_p, "min_p": p.min_p, "temperature": p.temp}
        if any(s not in value for s in chain[1:]) or ("temperature" in chain and p.dynatemp_range > 0):
            return None
        return _c.TopKChain(self.n_vocab, k, [(s, value[s]) for s in chain[1:]], p.min_keep)

    # -- which stages do anything (llama.cpp names a no-op stage "?name") --------------------------------

    @property
    def penalties_active(self) -> bool:
        p = self.params
        return self.repeat_last_n != 0 and not (
            p.repeat_penalty == 1.0 and p.frequency_penalty == 0.0 and p.presence_penalty == 0.0)

    @property
    def dry_active(self) -> bool:
        p = self.params
        return p.dry_multiplier != 0.0 and p.dry_base >= 1.0 and self.dry_last_n != 0

    def _active(self, name: str) -> bool:
        p = self.params
        return {"penalties": self.penalties_active, "dry": self.dry_active, "top_n_sigma": p.top_n_sigma > 0,
                "top_k": p.top_k > 0, "typ_p": p.typ_p < 1.0, "top_p": p.top_p < 1.0, "min_p": p.min_p > 0.0,
                "xtc": p.xtc_probability > 0.0 and p.xtc_threshold <= 0.5,
                "temperature": p.temp != 1.0 or p.dynatemp_range > 0}[name]

    _LABEL = {"penalties": "penalties", "dry": "dry", "top_n_sigma": "top-n-sigma", "top_k": "top-k",
              "typ_p": "typical", "top_p": "top-p", "min_p": "min-p", "xtc": "xtc", "temperature": "temp-ext"}

    def _stage_names(self) -> list:
        p = self.params
        if p.mirostat:
            return ["temp", "mirostat" if p.mirostat == 1 else "mirostat-v2"]
        return [self._LABEL[s] if self._active(s) else "?" + self._LABEL[s] for s in p.samplers] + ["dist"]

    def describe(self) -> str:
        """The sampler banner llama-completion logs before generating (common_params_sampling::print)."""
        p = self.params
        return "\n".join([
            f"sampler seed: {self.seed}",
            "sampler params: ",
            f"\trepeat_last_n = {self.repeat_last_n}, repeat_penalty = {p.repeat_penalty:.3f}, "
            f"frequency_penalty = {p.frequency_penalty:.3f}, presence_penalty = {p.presence_penalty:.3f}",
            f"\tdry_multiplier = {p.dry_multiplier:.3f}, dry_base = {p.dry_base:.3f}, dry_allowed_length = "
            f"{p.dry_allowed_length}, dry_penalty_last_n = {self.dry_last_n}",
            f"\ttop_k = {p.top_k}, top_p = {p.top_p:.3f}, min_p = {p.min_p:.3f}, xtc_probability = "
            f"{p.xtc_probability:.3f}, xtc_threshold = {p.xtc_threshold:.3f}, typical_p = {p.typ_p:.3f}, "
            f"top_n_sigma = {p.top_n_sigma:.3f}, temp = {p.temp:.3f}",
            f"\tmirostat = {p.mirostat}, mirostat_lr = {p.mirostat_eta:.3f}, mirostat_ent = {p.mirostat_tau:.3f}",
            "sampler chain: logits " + "".join(f"-> {n} " for n in self._stage_names()),
        ])

    # -- history -------------------------------------------------------------------------------------

    def accept(self, token: int) -> None:
        """Record a token (prompt or generated): the penalties' window and DRY's."""
        token = int(token)
        if self._dry is not None:
            self._dry.accept(token)
        if self.repeat_last_n <= 0:
            return
        self._prev.append(token)
        self._count[token] = self._count.get(token, 0) + 1
        if len(self._prev) > self.repeat_last_n:
            old = self._prev.popleft()
            c = self._count[old] - 1
            if c:
                self._count[old] = c
            else:
                del self._count[old]

    def reset(self, history: bool = True) -> None:
        """llama_sampler_reset: forget the history, re-seed every stage that draws (a new seed when it is -1)."""
        if history:
            self._prev.clear()
            self._count.clear()
            if self._dry is not None:
                self._dry.reset()
        p = self.params
        self.seed = resolve_seed(p.seed)
        self._rng_dist, self._rng_xtc = Mt19937(self.seed), Mt19937(self.seed)
        self._mu = _F(2.0) * _F(p.mirostat_tau)

    # -- the stages ----------------------------------------------------------------------------------

    def apply_penalties(self, logits: np.ndarray) -> np.ndarray:
        """llama_sampler_penalties_apply on a float32 copy: each distinct token in the window once."""
        x = np.array(logits, dtype=np.float32, copy=True)
        if x.shape != (self.n_vocab,):
            raise ValueError(f"expected logits of shape ({self.n_vocab},), got {x.shape}")
        self._penalties(x, None)
        return x

    def _penalties(self, x: np.ndarray, ids) -> None:
        if not self.penalties_active or not self._count:
            return
        tok = np.fromiter(self._count.keys(), dtype=np.int64, count=len(self._count))
        cnt = np.fromiter(self._count.values(), dtype=np.float32, count=len(self._count))
        ok = (tok >= 0) & (tok < self.n_vocab)
        tok, cnt = tok[ok], cnt[ok]
        if ids is not None:      # the candidates, in their order: find each penalised token's place
            where = np.full(self.n_vocab, -1, dtype=np.int64)
            where[ids] = np.arange(ids.shape[0])
            j = where[tok]
            cnt, pos = cnt[j >= 0], j[j >= 0]
        else:
            pos = tok
        lv = x[pos]
        lv = np.where(lv <= 0, lv * self._repeat, lv / self._repeat).astype(np.float32)
        x[pos] = lv - (cnt * self._freq + _F(1.0) * self._present)

    def _stage(self, name: str, c: Candidates) -> None:
        p = self.params
        if name == "penalties":
            if self.penalties_active:
                self._penalties(c.logits, c.ids)
                c.sorted = False
        elif name == "dry":
            if self._dry is not None:
                self._dry.apply(c.ids, c.logits)
                c.sorted = False
        elif name == "top_k":
            if p.top_k > 0:
                k = min(p.top_k, c.logits.shape[0])
                c.take(np.arange(k) if c.sorted else _top_k_order(c.logits, k), True)
        elif name == "top_p":
            self._top_p(c)
        elif name == "min_p":
            self._min_p(c)
        elif name == "typ_p":
            typical(c, p)
        elif name == "top_n_sigma":
            top_n_sigma(c, p)
        elif name == "xtc":
            if self._active("xtc"):
                xtc(c, p, self._rng_xtc)
        elif name == "temperature":     # llama_sampler_temp_ext_apply
            if p.dynatemp_range > 0:
                dynamic_temp(c, p)
            else:
                temp(c, p.temp)

    def _top_p(self, c: Candidates) -> None:
        p = _F(self.params.top_p)
        if self.params.top_p >= 1.0 or c.logits.shape[0] == 0:
            return
        if c.sorted and NATIVE:
            c.head(_c.top_p_sorted(c.logits, p, self.params.min_keep))
            return
        softmax(c, do_sort=False)
        n = c.logits.shape[0]
        if c.sorted:
            order, cum = None, np.cumsum(c.p, dtype=np.float32)
        else:   # like llama.cpp, try the most likely 256 first; widen if they fall short
            k = _TOP_P_GUESS if n > _TOP_P_GUESS_MIN_SIZE else n
            while True:
                order = _top_k_order(c.logits, k) if k < n else descending(c.logits)
                cum = np.cumsum(c.p[order], dtype=np.float32)
                if k >= n or cum[-1] >= p:
                    break
                k = min(16 * k, n)
        hit = np.flatnonzero((cum >= p) & (np.arange(1, cum.shape[0] + 1) >= self.params.min_keep))
        last = int(hit[0]) + 1 if hit.shape[0] else n
        c.take(np.arange(last) if order is None else order[:last], True)

    def _min_p(self, c: Candidates) -> None:
        if self.params.min_p <= 0.0 or c.logits.shape[0] == 0:
            return
        log_p = _F(np.log(_F(self.params.min_p)))
        if not c.sorted:
            keep = np.flatnonzero(c.logits >= c.logits.max() + log_p)
            if keep.shape[0] and keep.shape[0] >= self.params.min_keep:
                c.take(keep, False)
                return
            c.take(descending(c.logits), True)
        if NATIVE:
            c.head(_c.min_p_sorted(c.logits, _F(self.params.min_p), self.params.min_keep))
            return
        below = 1 + np.flatnonzero(c.logits[1:] < c.logits[0] + log_p)  # the first token always stays
        below = below[below >= self.params.min_keep]
        c.take(np.arange(int(below[0]) if below.shape[0] else c.logits.shape[0]), True)

    def _dist(self, c: Candidates, u=None) -> int:
        """llama_sampler_dist_apply: float32 expf(l - max), double running sum, the first index reaching
        sum * U[0, 1) (one draw even for a single candidate, as llama.cpp keeps its RNG aligned); u: the draw
        already made."""
        u = self._rng_dist.uniform_double() if u is None else u
        if c.ids.shape[0] == 1:
            return int(c.ids[0])
        if NATIVE:
            return int(c.ids[_c.dist(c.logits, c.sorted, u)])
        e = np.exp(c.logits - (c.logits[0] if c.sorted else c.logits.max()), dtype=np.float32)
        cum = np.cumsum(e, dtype=np.float64)
        i = min(int(np.searchsorted(cum, cum[-1] * u, side="left")), c.ids.shape[0] - 1)
        return int(c.ids[i])

    # -- the chain -----------------------------------------------------------------------------------

    def candidates(self, logits: np.ndarray) -> tuple:
        """Token ids and float32 logits left after the chain's stages (before the draw)."""
        with np.errstate(all="ignore"):
            c = self._run(logits)
        return c.ids, c.logits

    def _run(self, logits: np.ndarray) -> Candidates:
        chain = () if self.params.mirostat else self._chain
        if chain and chain[0] == "top_k":
            # the usual chain starts by cutting to k candidates: cut the row as given (no copy of the vocabulary's
            # logits, no array of its ids), which leaves the candidates top_k would leave
            x = np.asarray(logits, dtype=np.float32)
            if x.shape != (self.n_vocab,):
                raise ValueError(f"expected logits of shape ({self.n_vocab},), got {x.shape}")
            k = min(self.params.top_k, self.n_vocab)
            got = _c.top_k(x, k) if NATIVE and k <= _C_TOP_K_MAX and k < self.n_vocab else None
            if got is None:
                order = _top_k_order(x, k)
                got = order, x[order]
            c = Candidates(got[0], got[1], True)
            chain = chain[1:]
        else:
            x = np.array(logits, dtype=np.float32, copy=True)
            if x.shape != (self.n_vocab,):
                raise ValueError(f"expected logits of shape ({self.n_vocab},), got {x.shape}")
            c = Candidates(np.arange(self.n_vocab), x, False)
        for name in chain:
            self._stage(name, c)
        return c

    def sample(self, logits: np.ndarray) -> int:
        """One token from a row of n_vocab logits. Does not accept() it; the caller does, as with
        common_sampler_sample / common_sampler_accept."""
        if self._fused is not None and NATIVE:     # the usual chain: one C call
            x = np.ascontiguousarray(logits, dtype=np.float32)
            if x.shape != (self.n_vocab,):
                raise ValueError(f"expected logits of shape ({self.n_vocab},), got {x.shape}")
            u = self._rng_dist.uniform_double()
            token = self._fused(x, u)
            if token is not None:
                return token
            with np.errstate(all="ignore"):     # a row with NaN logits: the stages one by one, the same draw
                return self._dist(self._run(x), u)
        with np.errstate(all="ignore"):
            c = self._run(logits)
            if not self.params.mirostat:
                return self._dist(c)
            token, self._mu = mirostat(c, self.params, self.n_vocab, self._mu, self._rng_dist)
            return token
