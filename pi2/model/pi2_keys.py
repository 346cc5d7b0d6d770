"""pi2_keys.py — the `pi2.*` metadata of a pi2 file checked once, when it is opened: required keys present, every
key of the type its readers take (sparse.py, info.py, plan/budget.py read them without checking again).
Does not: check tensors (loader.py) or the values' meaning beyond type and range (the readers)."""
from __future__ import annotations

import numpy as np

from pi2.errors import ModelFormatError

_STR = ("pi2.ffn.layout", "pi2.ffn.score", "pi2.predictor.kind", "pi2.predictor.input", "pi2.source.file",
        "pi2.source.magic", "pi2.source.sha256", "pi2.calib.sha256")
_INT = ("pi2.version", "pi2.predictor.bits", "pi2.predictor.rank", "pi2.calib.tokens")
_NUM = ("pi2.ffn.default_keep", "pi2.predictor.target_recall")
_TYPE_ARRAYS = ("pi2.ffn.down_types", "pi2.ffn.up_types", "pi2.ffn.gate_types")


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def check(kv: dict, path: str, n_layer: int) -> None:
    def bad(key: str, want: str):
        raise ModelFormatError(f"{path}: {key} must be {want} (got {str(kv.get(key, 'nothing'))[:40]!r})")

    for key in ("pi2.ffn.keep_grid", "pi2.ffn.down_types"):
        if key not in kv:
            bad(key, "present in a pi2 file")
    for key in _STR:
        if key in kv and not isinstance(kv[key], str):
            bad(key, "a string")
    for key in _INT:
        if key in kv and not _is_int(kv[key]):
            bad(key, "an integer")
    for key in _NUM:
        if key in kv and not (_is_int(kv[key]) or isinstance(kv[key], (float, np.floating))) or \
                key in kv and not 0.0 <= float(kv[key]) <= 1.0:
            bad(key, "a number in [0, 1]")
    grid = kv["pi2.ffn.keep_grid"]
    if not (isinstance(grid, np.ndarray) and grid.dtype.kind in "fiu" and grid.size and
            np.all(np.diff(grid.astype(np.float64)) > 0) and 0 < grid[0] and grid[-1] <= 1):
        bad("pi2.ffn.keep_grid", "an increasing list of fractions in (0, 1]")
    for key in _TYPE_ARRAYS:
        if key in kv and not (isinstance(kv[key], np.ndarray) and kv[key].dtype.kind in "iu" and
                              kv[key].size >= n_layer):
            bad(key, f"a list of {n_layer} ggml type ids")
    rec = kv.get("pi2.predictor.recall")
    if rec is not None and not (isinstance(rec, np.ndarray) and rec.dtype.kind == "f"):
        bad("pi2.predictor.recall", "a list of numbers")
