"""engine/sample.py — the C side of the sampler chain (csrc/sample.c): the top-k cut of a row of logits in one pass,
and on sorted candidates top-p's and min-p's cuts and the final draw; and the usual chain (top-k, then top-p,
min-p and temperature in a given order, then the draw) in one call, a token's sampling in a few microseconds.

Owns: top_k, top_p_sorted, min_p_sorted, dist, TopKChain. Does not: decide which stages run or draw random numbers
(pi2/runtime/sampling.py, whose numpy stages are the specification these must equal).
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from pi2.engine.lib import ffi, lib


def top_k(logits: np.ndarray, k: int) -> Optional[tuple]:
    """(ids, logits) of the k largest of a float32 row, largest first, equal logits in id order and ties at the cut
    to the lowest ids (int32 ids, float32 logits); None when fewer than k logits are numbers (NaN)."""
    x = np.ascontiguousarray(logits, dtype=np.float32)
    ids, vals = np.empty(k, dtype=np.int32), np.empty(k, dtype=np.float32)
    got = lib.pi2_top_k(ffi.from_buffer("float[]", x), x.shape[0], k, ffi.from_buffer("int32_t[]", ids),
                        ffi.from_buffer("float[]", vals))
    return (ids, vals) if got == k else None


def _f32(x: np.ndarray):
    return ffi.from_buffer("float[]", np.ascontiguousarray(x, dtype=np.float32))


def top_p_sorted(vals: np.ndarray, p: float, min_keep: int) -> int:
    """How many of the candidates (logits sorted largest first) top-p keeps."""
    return lib.pi2_top_p_sorted(_f32(vals), vals.shape[0], p, min_keep)


def min_p_sorted(vals: np.ndarray, p: float, min_keep: int) -> int:
    """How many of the candidates (logits sorted largest first) min-p keeps."""
    return lib.pi2_min_p_sorted(_f32(vals), vals.shape[0], p, min_keep)


def dist(vals: np.ndarray, is_sorted: bool, u: float) -> int:
    """The index the final draw picks with uniform double u (at least one candidate)."""
    return lib.pi2_dist(_f32(vals), vals.shape[0], int(is_sorted), u)


class TopKChain:
    """The top-k cut of a row of logits, then `stages` ((name, value) with name "top_p", "min_p" or "temperature",
    in order), then the draw: one C call (pi2_sample_top_k_chain) per token, its arguments made once."""

    _CODES = {"top_p": lib.PI2_SAMPLE_TOP_P, "min_p": lib.PI2_SAMPLE_MIN_P, "temperature": lib.PI2_SAMPLE_TEMP}

    def __init__(self, n_vocab: int, k: int, stages, min_keep: int):
        self.n_vocab, self.k, self.min_keep = n_vocab, k, min_keep
        self._stages = ffi.new("int32_t[]", [self._CODES[name] for name, _ in stages] or [0])
        self._params = ffi.new("float[]", [float(np.float32(v)) for _, v in stages] or [0.0])
        self._n_stages = len(stages)
        self._ids, self._vals, self._left = ffi.new("int32_t[]", k), ffi.new("float[]", k), ffi.new("int32_t *")

    def __call__(self, logits: np.ndarray, u: float) -> Optional[int]:
        """The token drawn with uniform double u from a contiguous float32 row of n_vocab logits; None when fewer
        than k logits are numbers (the caller runs the stages one by one)."""
        got = lib.pi2_sample_top_k_chain(ffi.from_buffer("float[]", logits), self.n_vocab, self.k, self._stages,
                                         self._params, self._n_stages, self.min_keep, u, self._ids, self._vals,
                                         self._left)
        if got == lib.PI2_SAMPLE_FEW:
            return None
        if got < 0:
            raise ValueError(f"pi2_sample_top_k_chain failed ({got})")
        return got

    def candidates(self) -> tuple:
        """(ids, float32 logits) the last call left before its draw."""
        n = self._left[0]
        return (np.frombuffer(ffi.buffer(self._ids, 4 * n), np.int32).copy(),
                np.frombuffer(ffi.buffer(self._vals, 4 * n), np.float32).copy())
