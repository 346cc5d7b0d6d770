"""calib.py — the calibration text a profile routes through a model (`pi2 convert`, `pi2 profile-experts`): chunks of
CHUNK tokens evenly spaced over it, and its sha256 (the converted file records it).
Does not: run the model or count anything (pi2/convert/profile.py, pi2/convert/moe.py, pi2/plan/experts.py).
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from pi2.errors import UsageError

DEFAULT_CALIB = Path(__file__).resolve().parent.parent / "data" / "calib.txt"
CHUNK = 256


def calib_tokens(tokenizer, path: Path | None, n_tokens: int) -> tuple[list, str, int]:
    """Chunks of CHUNK tokens evenly spaced over the calibration text; (chunks, text sha256, tokens used)."""
    path = Path(path) if path else DEFAULT_CALIB
    try:
        data = path.read_bytes()
    except OSError as e:
        raise UsageError(f"cannot read calibration text {path}: {e.strerror}") from None
    if n_tokens < 16:
        raise UsageError(f"--calib-tokens must be at least 16 (got {n_tokens})")
    ids = tokenizer.encode(data.decode("utf-8", "replace"), add_special=False)
    if len(ids) < 16:
        raise UsageError(f"calibration text {path} has only {len(ids)} tokens")
    size = min(CHUNK, n_tokens, len(ids))
    n_avail = len(ids) // size
    n_chunks = max(1, min(n_avail, -(-n_tokens // size)))
    starts = np.linspace(0, n_avail - 1, n_chunks).round().astype(int) * size
    bos = [tokenizer.bos_id] if getattr(tokenizer, "add_bos", False) and tokenizer.bos_id is not None else []
    chunks = [bos + ids[s:s + size - len(bos)] for s in starts]
    return chunks, hashlib.sha256(data).hexdigest(), sum(len(c) for c in chunks)
