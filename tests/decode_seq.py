"""decode_seq.py — the token sequence the C-vs-reference FFN tests decode: a prompt batch of 8, then 3 single
tokens, then a batch of 3, so batches and single-token decode both meet the sparse FFN."""
from __future__ import annotations

import numpy as np

TOKENS = [1, 5, 9, 200, 33, 7, 80, 90, 311, 42, 17, 64, 3, 99]


def run(ctx) -> np.ndarray:
    """Logits of every token of TOKENS decoded by ctx in that pattern."""
    out = [ctx.decode(TOKENS[:8], all_logits=True)]
    out += [ctx.decode([t], all_logits=True) for t in TOKENS[8:11]]
    out.append(ctx.decode(TOKENS[11:], all_logits=True))
    return np.concatenate(out)
