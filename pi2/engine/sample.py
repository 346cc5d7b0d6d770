"""engine/sample.py — the C side of the sampler chain (csrc/sample.c): the top-k cut of a row of logits in one pass,
and on sorted candidates top-p's and min-p's cuts and the final draw.

Owns: top_k, top_p_sorted, min_p_sorted, dist. Does not: decide which stages run or draw random numbers
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
