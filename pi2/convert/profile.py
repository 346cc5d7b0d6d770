# profile.py — activation statistics of a model's FFN neurons on calibration text.
# Owns: per-layer streaming statistics over the calibration chunks (pi2/model/calib.py) layerwise.py runs the
#       model over (a fine |act(gate)| histogram for thresholds, per-neuron exceedance
#       counts on a coarse magnitude grid for frequencies, a token subsample of act and act·up for errors),
#       and deriving thresholds, frequencies and FFN-output errors at each keep fraction.
# Does not: reorder, quantize or write anything (layout.py, writer.py).
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pi2.model.calib import CHUNK, DEFAULT_CALIB, calib_tokens  # noqa: F401  (convert's names for them)

KEEP_GRID = np.round(np.arange(1, 21) * 0.05, 2).astype(np.float32)    # 0.05 .. 1.0
DEFAULT_KEEP = 0.8                             # ≤ 3 % perplexity over dense on SmolLM2 (see README)
ERR_TOKENS = 192                              # token rows kept per layer for the error statistics
_HIST = np.logspace(-8, 4, 2401)              # layer-wide |act| histogram edges (200 per decade)
_COARSE = np.logspace(-4, 1, 81)              # per-neuron exceedance grid (16 per decade)


def act_fn(name: str):
    if name == "silu":
        return lambda g: g / (1.0 + np.exp(-g))
    if name == "gelu":
        c = np.float32(np.sqrt(2.0 / np.pi))
        return lambda g: 0.5 * g * (1.0 + np.tanh(c * (g + np.float32(0.044715) * g * g * g)))
    return lambda g: np.maximum(g, 0)


@dataclass
class LayerStats:
    n_ff: int
    hist: np.ndarray = None          # counts of |act| per _HIST bin (+ under/overflow)
    exceed: np.ndarray = None        # (n_ff, len(_COARSE)) tokens with |act| > grid value
    n_tok: int = 0
    act: list = field(default_factory=list)     # subsample rows of act(gate), float16
    h: list = field(default_factory=list)       # subsample rows of act(gate)·up, float16
    n_sub: int = 0

    def __post_init__(self):
        self.hist = np.zeros(len(_HIST) + 1, np.int64)
        self.exceed = np.zeros((self.n_ff, len(_COARSE)), np.int32)

    def add(self, a: np.ndarray, up: np.ndarray, stride: int) -> None:
        with np.errstate(divide="ignore"):
            lg = np.log10(np.abs(a))
        # fine bins: bin k holds (_HIST[k-1], _HIST[k]]; ceil of the fractional edge index, as searchsorted
        k = np.ceil((lg + 8.0) * 200.0)
        k = np.clip(np.nan_to_num(k, neginf=0.0), 0, len(_HIST)).astype(np.int64)
        self.hist += np.bincount(k.ravel(), minlength=len(_HIST) + 1)
        # coarse grid values strictly below |a| (16 per decade from 1e-4)
        b = np.ceil((lg + 4.0) * 16.0)
        b = np.clip(np.nan_to_num(b, neginf=0.0), 0, len(_COARSE)).astype(np.int64)
        G = len(_COARSE) + 1
        cnt = np.bincount((b + (np.arange(self.n_ff) * G)[None, :]).ravel(), minlength=self.n_ff * G)
        cnt = cnt.reshape(self.n_ff, G)
        # tokens with s > grid[j] = those in coarse bins > j
        self.exceed += np.cumsum(cnt[:, ::-1], axis=1)[:, ::-1][:, 1:]
        rows = np.arange(0, a.shape[0], stride)
        rows = rows[:max(0, ERR_TOKENS - self.n_sub)]
        if rows.size:
            self.act.append(a[rows].astype(np.float16))
            self.h.append((a[rows] * up[rows]).astype(np.float16))
            self.n_sub += rows.size
        self.n_tok += a.shape[0]

    def threshold(self, keep: float) -> float:
        """|act| threshold keeping the fraction `keep` of (token, neuron) pairs (log-interpolated)."""
        if keep >= 1.0:
            return 0.0
        total = self.hist.sum()
        above = total - np.cumsum(self.hist)       # above[k] = pairs in bins > k, i.e. s > _HIST[k]
        target = keep * total
        k = int(np.searchsorted(-above[:-1], -target, side="left"))   # first edge with above <= target
        if k <= 0:
            return float(_HIST[0])
        if k >= len(_HIST):
            return float(_HIST[-1])
        a0, a1 = above[k - 1], above[k]
        f = 0.0 if a0 == a1 else (a0 - target) / (a0 - a1)
        return float(np.exp(np.log(_HIST[k - 1]) + f * (np.log(_HIST[k]) - np.log(_HIST[k - 1]))))

    def frequency(self, t: float) -> np.ndarray:
        """Per-neuron fraction of tokens with |act| > t (log-interpolated on the coarse grid)."""
        e = self.exceed / max(self.n_tok, 1)
        if t <= _COARSE[0]:
            return e[:, 0].astype(np.float32)
        if t >= _COARSE[-1]:
            return e[:, -1].astype(np.float32)
        j = int(np.searchsorted(_COARSE, t)) - 1
        f = (np.log(t) - np.log(_COARSE[j])) / (np.log(_COARSE[j + 1]) - np.log(_COARSE[j]))
        return ((1 - f) * e[:, j] + f * e[:, j + 1]).astype(np.float32)


def ffn_errors(act: np.ndarray, h: np.ndarray, down: np.ndarray, thresholds, score: np.ndarray | None = None):
    """Relative L2 error of the FFN output (tokens × n_embd) when pairs with score <= t are dropped.
    act, h: (tokens, n_ff); down: (n_embd, n_ff) float32; score defaults to |act|. One product per threshold
    (a stacked one holds 1 + len(thresholds) copies of h: 78 MB for a 4864-neuron layer)."""
    s = np.abs(act) if score is None else score
    sq = [float(np.sum(((np.where(s > t, 0, h) if i else h) @ down.T).astype(np.float64) ** 2))
          for i, t in enumerate([None] + list(thresholds))]
    return np.sqrt(np.array(sq[1:]) / (sq[0] or 1.0)).astype(np.float32)


@dataclass
class Profile:
    layers: list                # LayerStats per layer
    calib_sha256: str
    n_tokens: int
    thresh: np.ndarray = None   # (n_layer, len(KEEP_GRID))
    freq: list = None           # per layer (n_ff,) float32, source order
    err: np.ndarray = None      # (n_layer, len(KEEP_GRID))


def layer_summary(L: "LayerStats", down: np.ndarray, default_keep: float = DEFAULT_KEEP):
    """(thresholds at the keep grid, per-neuron frequency at the default keep's threshold, FFN-output errors
    at the keep grid) of one layer; down: (n_embd, n_ff) float32 in source neuron order."""
    thresh = np.array([L.threshold(k) for k in KEEP_GRID], np.float32)
    freq = L.frequency(L.threshold(default_keep))
    a, h = np.concatenate(L.act).astype(np.float32), np.concatenate(L.h).astype(np.float32)
    ts = [t if k < 1 else -1.0 for t, k in zip(thresh, KEEP_GRID)]
    return thresh, freq, ffn_errors(a, h, down, ts)


def keep_for_error(err_row: np.ndarray, target: float) -> float:
    """Smallest keep on the grid whose error is <= target (linear interpolation between grid points)."""
    for j, e in enumerate(err_row):
        if e <= target:
            if j == 0:
                return float(KEEP_GRID[0])
            e0, k0, k1 = err_row[j - 1], KEEP_GRID[j - 1], KEEP_GRID[j]
            return float(k0 + (k1 - k0) * (e0 - target) / max(e0 - e, 1e-12))
    return 1.0
