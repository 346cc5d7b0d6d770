"""sampling_candidates.py — what every stage of the sampler chain (pi2/runtime/sampling.py) works on: the candidates
(llama_token_data_array) and the float32 arithmetic the stages share, as src/llama-sampler.cpp does it: the order by
logit, a running sum in index order, softmax and temperature.
Does not: hold any stage's parameters or state, or draw (sampling.py, sampling_extra.py, sampling_dry.py).
"""
from __future__ import annotations

import numpy as np

_F = np.float32


class Candidates:
    """llama_token_data_array: token ids with their float32 logits, probabilities when a stage computed them, and
    whether they are sorted by logit (largest first)."""

    __slots__ = ("ids", "logits", "p", "sorted")

    def __init__(self, ids: np.ndarray, logits: np.ndarray, is_sorted: bool):
        self.ids, self.logits, self.p, self.sorted = ids, logits, None, is_sorted

    def head(self, m: int) -> None:
        """Keep the first m (sorted stays sorted); probabilities are dropped (every reader recomputes them)."""
        self.ids, self.logits, self.p = self.ids[:m], self.logits[:m], None

    def take(self, order, is_sorted: bool) -> None:
        self.ids, self.logits, self.sorted = self.ids[order], self.logits[order], is_sorted
        self.p = None if self.p is None else self.p[order]


def descending(logits: np.ndarray) -> np.ndarray:
    """Order by logit, largest first; ties keep their current order (lowest token id first on a fresh array)."""
    return np.argsort(-logits, kind="stable")


def seq_sum(x: np.ndarray, dtype=np.float32):
    """A running sum in index order (C's for loop), not numpy's pairwise sum."""
    return np.cumsum(x, dtype=dtype)[-1] if x.shape[0] else dtype(0)


def softmax(c: Candidates, do_sort: bool = True) -> None:
    """llama_sampler_softmax_impl: sort if asked, float32 expf(l - max), float32 running sum, divide."""
    if do_sort and not c.sorted:
        c.take(descending(c.logits), True)
    e = np.exp(c.logits - (c.logits[0] if c.sorted else c.logits.max()), dtype=np.float32)
    c.p = e / seq_sum(e)


def temp(c: Candidates, t) -> None:
    """llama_sampler_temp_impl: divide by t; t <= 0 keeps only the first largest logit (others -inf)."""
    if c.logits.shape[0] == 0:
        return
    if t <= 0:
        keep = int(np.argmax(c.logits))
        out = np.full_like(c.logits, -np.inf)
        out[keep] = c.logits[keep]
        c.logits = out
        return
    c.logits = (c.logits / _F(t)).astype(np.float32)
