"""expert_profile.py — a MoE file's routing profile on disk: the rows each expert received, kept in
~/.cache/pi2/experts/ by file name and size, written whole or not at all (a temporary file synced and renamed over
it), read back only when its shape fits the model; a streamed run adds its routing to it (`add_to_profile`).
Does not: route anything (experts.profile_experts) or choose hot experts from it (experts.make_expert_plan).
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np

from pi2.plan.profile import default_cache_dir

MIN_RUN_TOKENS = 64     # a run adds its routing to the profile from this many tokens on (fewer say little)


def profile_path(model) -> Path:
    """Where `pi2 profile-experts` keeps a file's routing counts (by name and size)."""
    st = os.stat(model.path)
    return default_cache_dir() / "experts" / f"{os.path.basename(model.path)}.{st.st_size}.json"


def _read_profile(model) -> tuple:
    """(counts [n_layer][n_expert] as float64, tokens) of the file's routing profile, or (None, 0)."""
    try:
        d = json.loads(profile_path(model).read_text())
        counts, tokens = np.asarray(d["expert_rows"], np.float64), int(d.get("tokens", 0))
    except (OSError, ValueError, KeyError, TypeError):
        return None, 0
    c = model.config
    ok = counts.shape == (c.n_layer, c.n_expert) and bool(np.all(counts >= 0))
    return (counts, tokens) if ok else (None, 0)


def load_profile(model) -> np.ndarray | None:
    """[n_layer][n_expert] routed rows per expert from the file's routing profile, or None."""
    return _read_profile(model)[0]


def save_profile(model, counts: np.ndarray, tokens: int) -> Path:
    """Write the profile whole or not at all: a temporary file in the same directory, synced, renamed over it."""
    p = profile_path(model)
    p.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"tokens": int(tokens), "expert_rows": np.asarray(counts).astype(np.int64).tolist()})
    fd, tmp = tempfile.mkstemp(prefix=p.name + ".", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return p


def add_to_profile(model, counts: np.ndarray) -> tuple:
    """Add a run's routed rows (ctx.expert_counts) to the file's routing profile, so the next run's plan starts with
    hot experts; (path, tokens the run routed), path None when the run routed fewer than MIN_RUN_TOKENS tokens.
    OSError when the profile cannot be written (the old one is then left as it was)."""
    c = model.config
    counts = np.asarray(counts, np.int64)
    per_layer = counts.sum(axis=1)
    tokens = int(per_layer.max() // max(c.n_expert_used, 1)) if counts.size else 0
    if tokens < MIN_RUN_TOKENS or counts.shape != (c.n_layer, c.n_expert):
        return None, tokens
    old, old_tokens = _read_profile(model)
    total = counts + (old.astype(np.int64) if old is not None else 0)
    return save_profile(model, total, old_tokens + tokens), tokens
