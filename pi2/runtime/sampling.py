"""sampling.py — llama.cpp's default sampler chain (penalties -> top-k -> top-p -> min-p -> temp -> dist) in numpy.

Semantics follow llama.cpp's src/llama-sampling.cpp and common/sampling.cpp (chain order, float32 logit
arithmetic, "?name" for samplers that are no-ops, the "sampler params:" banner). The final draw uses numpy's
PCG64 generator, not std::mt19937: a given seed reproduces pi2's own runs, not llama.cpp's token choices.
"""
from __future__ import annotations

import os
from collections import deque

import numpy as np

from pi2.errors import UsageError
from pi2.runtime.config import SamplerParams

LLAMA_DEFAULT_SEED = 0xFFFFFFFF  # a seed of -1 wraps to this; both mean "pick a random seed"

# top-p: when the candidates are not sorted yet, first try the 256 most likely ones, as llama.cpp does.
_TOP_P_GUESS = 256
_TOP_P_GUESS_MIN_SIZE = 1024
_TOP_K_SUBSET = 2048    # top-k of a large vocabulary: a subset this size bounds the cut first


def resolve_seed(seed: int) -> int:
    """llama.cpp's get_rng_seed: -1 / LLAMA_DEFAULT_SEED -> a random 32-bit seed, else the seed as uint32."""
    s = int(seed) & 0xFFFFFFFF
    if s == LLAMA_DEFAULT_SEED:
        return int.from_bytes(os.urandom(4), "little")
    return s


class _Candidates:
    """llama_token_data_array: token ids with their (float32) logits, and whether they are sorted by logit."""

    __slots__ = ("ids", "logits", "sorted")

    def __init__(self, ids: np.ndarray, logits: np.ndarray, is_sorted: bool):
        self.ids, self.logits, self.sorted = ids, logits, is_sorted

    def take(self, order: np.ndarray, is_sorted: bool) -> None:
        self.ids, self.logits, self.sorted = self.ids[order], self.logits[order], is_sorted


def _descending(logits: np.ndarray) -> np.ndarray:
    """Order by logit, largest first; ties keep their current order (lowest token id first on a fresh array)."""
    return np.argsort(-logits, kind="stable")


def _top_k_order(logits: np.ndarray, k: int) -> np.ndarray:
    """Indices of exactly k largest logits, sorted descending. Ties at the cut go to the lowest index.

    llama.cpp also keeps exactly k, but which of several tied tokens survive at the cut depends on
    std::partial_sort; pi2 fixes that choice to the lowest token ids.
    """
    n = logits.shape[0]
    if k >= n:
        return _descending(logits)
    if n >= 8 * _TOP_K_SUBSET and k <= _TOP_K_SUBSET // 8:
        # the k-th largest of a strided subset is at most the k-th largest of all, so every one of the k largest
        # logits (ties at the cut included) is at or above it: the exact selection runs on those few only
        # (a full-vocabulary argpartition costs ~0.7 ms a token, this ~0.1 ms)
        sub = logits[::n // _TOP_K_SUBSET]
        floor = np.partition(sub, sub.shape[0] - k)[sub.shape[0] - k]
        cand = np.flatnonzero(logits >= floor)
        if cand.shape[0] <= n // 2:      # (a vocabulary of mostly equal logits takes the direct way)
            return cand[_top_k_order(logits[cand], k)]
    part = np.argpartition(logits, n - k)[n - k:]
    thr = logits[part].min()
    n_eq_part = int(np.count_nonzero(logits[part] == thr))
    if n_eq_part != int(np.count_nonzero(logits == thr)):
        above = np.flatnonzero(logits > thr)
        tied = np.flatnonzero(logits == thr)[: k - above.shape[0]]
        part = np.concatenate([above, tied])
    else:
        part.sort()  # index order, so the stable sort below breaks ties by lowest index
    return part[_descending(logits[part])]


def _softmax_f32(logits: np.ndarray) -> np.ndarray:
    """llama_sampler_softmax_impl: float32 expf(l - max), float32 running sum, in the current order."""
    e = np.exp(logits - logits.max(), dtype=np.float32)
    return e / np.cumsum(e, dtype=np.float32)[-1]


class Sampler:
    """The default llama-completion sampler chain over one vocabulary.

    accept() every token the context sees, prompt tokens included (llama-completion pushes the prompt into
    the sampler so the repeat penalty covers it), then sample() the next token from a row of logits.
    """

    def __init__(self, params: SamplerParams, n_vocab: int, n_ctx: int):
        if n_vocab <= 0:
            raise UsageError(f"sampler needs a positive vocabulary size, got {n_vocab}")
        if params.repeat_last_n < -1:
            raise UsageError(f"--repeat-last-n must be -1 (context size), 0 (off) or positive, "
                             f"got {params.repeat_last_n}")
        self.params = params
        self.n_vocab = n_vocab
        self.n_ctx = n_ctx
        # common_init_from_params turns -1 into the context size before the chain is built
        self.repeat_last_n = n_ctx if params.repeat_last_n == -1 else params.repeat_last_n
        self.seed = resolve_seed(params.seed)
        self._rng = np.random.Generator(np.random.PCG64(self.seed))
        self._prev: deque[int] = deque()
        self._count: dict[int, int] = {}
        f32 = np.float32
        self._repeat, self._freq, self._present = f32(params.repeat_penalty), f32(params.frequency_penalty), \
            f32(params.presence_penalty)
        self._f_temp, self._f_top_p, self._f_min_p = f32(params.temp), f32(params.top_p), f32(params.min_p)

    # -- which stages do anything (llama.cpp names a no-op stage "?name") --------------------------------

    @property
    def penalties_active(self) -> bool:
        p = self.params
        return self.repeat_last_n > 0 and not (
            p.repeat_penalty == 1.0 and p.frequency_penalty == 0.0 and p.presence_penalty == 0.0)

    def _stage_names(self) -> list[str]:
        p = self.params
        on = [("penalties", self.penalties_active), ("dry", False), ("top-n-sigma", False),
              ("top-k", p.top_k > 0), ("typical", False), ("top-p", p.top_p < 1.0), ("min-p", p.min_p > 0.0),
              ("xtc", False), ("temp-ext", p.temp != 1.0), ("dist", True)]
        return [name if active else "?" + name for name, active in on]

    def describe(self) -> str:
        """The sampler banner llama-completion logs before generating (common_params_sampling::print)."""
        p = self.params
        lines = [
            f"sampler seed: {self.seed}",
            "sampler params: ",
            f"\trepeat_last_n = {self.repeat_last_n}, repeat_penalty = {p.repeat_penalty:.3f}, "
            f"frequency_penalty = {p.frequency_penalty:.3f}, presence_penalty = {p.presence_penalty:.3f}",
            f"\tdry_multiplier = 0.000, dry_base = 1.750, dry_allowed_length = 2, dry_penalty_last_n = {self.n_ctx}",
            f"\ttop_k = {p.top_k}, top_p = {p.top_p:.3f}, min_p = {p.min_p:.3f}, xtc_probability = 0.000, "
            f"xtc_threshold = 0.100, typical_p = 1.000, top_n_sigma = -1.000, temp = {p.temp:.3f}",
            "\tmirostat = 0, mirostat_lr = 0.100, mirostat_ent = 5.000",
            "sampler chain: logits " + "".join(f"-> {n} " for n in self._stage_names()),
        ]
        return "\n".join(lines)

    # -- history -------------------------------------------------------------------------------------

    def accept(self, token: int) -> None:
        """Record a token (prompt or generated) in the repeat-penalty window of the last repeat_last_n."""
        if self.repeat_last_n <= 0:
            return
        token = int(token)
        self._prev.append(token)
        self._count[token] = self._count.get(token, 0) + 1
        if len(self._prev) > self.repeat_last_n:
            old = self._prev.popleft()
            c = self._count[old] - 1
            if c:
                self._count[old] = c
            else:
                del self._count[old]

    def reset(self) -> None:
        """llama_sampler_reset: forget the history and re-seed (a new random seed when the seed is -1)."""
        self._prev.clear()
        self._count.clear()
        self.seed = resolve_seed(self.params.seed)
        self._rng = np.random.Generator(np.random.PCG64(self.seed))

    # -- the chain -----------------------------------------------------------------------------------

    def apply_penalties(self, logits: np.ndarray) -> np.ndarray:
        """llama_sampler_penalties_apply on a float32 copy: each distinct token in the window once."""
        x = np.array(logits, dtype=np.float32, copy=True)
        if x.shape != (self.n_vocab,):
            raise ValueError(f"expected logits of shape ({self.n_vocab},), got {x.shape}")
        if not self.penalties_active or not self._count:
            return x
        ids = np.fromiter(self._count.keys(), dtype=np.int64, count=len(self._count))
        cnt = np.fromiter(self._count.values(), dtype=np.float32, count=len(self._count))
        ids_ok = (ids >= 0) & (ids < self.n_vocab)
        ids, cnt = ids[ids_ok], cnt[ids_ok]
        lv = x[ids]
        lv = np.where(lv <= 0, lv * self._repeat, lv / self._repeat).astype(np.float32)
        lv -= cnt * self._freq + np.float32(1.0) * self._present
        x[ids] = lv
        return x

    def _top_k(self, c: _Candidates) -> None:
        k = self.params.top_k
        if k <= 0:
            return
        c.take(_top_k_order(c.logits, min(k, c.logits.shape[0])), True)

    def _top_p(self, c: _Candidates) -> None:
        if self.params.top_p >= 1.0:
            return
        probs = _softmax_f32(c.logits)
        n = probs.shape[0]
        if c.sorted:
            order = None
            cum = np.cumsum(probs, dtype=np.float32)
        else:
            # like llama.cpp, try the most likely 256 first; widen (x16 here, to all there) if they fall short
            k = _TOP_P_GUESS if n > _TOP_P_GUESS_MIN_SIZE else n
            while True:
                order = _top_k_order(c.logits, k) if k < n else _descending(c.logits)
                cum = np.cumsum(probs[order], dtype=np.float32)
                if k >= n or cum[-1] >= self._f_top_p:
                    break
                k = min(16 * k, n)
        hit = np.flatnonzero(cum >= self._f_top_p)
        last = int(hit[0]) + 1 if hit.shape[0] else n
        if order is None:
            c.take(np.arange(last), True)
        else:
            c.take(order[:last], True)

    def _min_p(self, c: _Candidates) -> None:
        if self.params.min_p <= 0.0 or c.logits.shape[0] == 0:
            return
        log_p = np.float32(np.log(self._f_min_p))
        if not c.sorted:
            keep = np.flatnonzero(c.logits >= c.logits.max() + log_p)
            if keep.shape[0]:
                c.take(keep, False)
                return
            c.take(_descending(c.logits), True)
        below = np.flatnonzero(c.logits[1:] < c.logits[0] + log_p)  # the first token always stays
        last = int(below[0]) + 1 if below.shape[0] else c.logits.shape[0]
        c.take(np.arange(last), True)

    def _dist(self, c: _Candidates) -> int:
        """llama_sampler_dist_apply: float32 softmax, double running sum, first index reaching sum*U[0,1)."""
        if c.ids.shape[0] == 1:
            return int(c.ids[0])
        e = np.exp(c.logits - c.logits.max(), dtype=np.float32)
        cum = np.cumsum(e, dtype=np.float64)
        target = cum[-1] * self._rng.random()
        i = min(int(np.searchsorted(cum, target, side="left")), c.ids.shape[0] - 1)
        return int(c.ids[i])

    def candidates(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Token ids and float32 logits left after penalties, top-k, top-p, min-p and temp (before the draw)."""
        x = self.apply_penalties(logits)
        c = _Candidates(np.arange(self.n_vocab), x, False)
        self._top_k(c)
        self._top_p(c)
        self._min_p(c)
        if self.params.temp > 0 and self.params.temp != 1.0:
            c.logits = c.logits / self._f_temp
        return c.ids, c.logits

    def sample(self, logits: np.ndarray) -> int:
        """One token from a row of n_vocab logits. temp <= 0 is greedy: argmax after penalties, lowest id on ties.

        Does not accept() the token; the caller does, as with common_sampler_sample/accept.
        """
        if self.params.temp <= 0:
            # top-k/top-p/min-p always keep the most likely token, so greedy is argmax after penalties
            return int(np.argmax(self.apply_penalties(logits)))
        ids, lv = self.candidates(logits)
        return self._dist(_Candidates(ids, lv, True))
