"""engine/sample.py — the C side of the sampler chain (csrc/sample.c): the top-k cut of a row of logits in one pass.

Owns: top_k. Does not: decide when the chain cuts or what it does after (pi2/runtime/sampling.py, the numpy
specification top_k must equal).
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
