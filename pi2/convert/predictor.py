# predictor.py — pi2-made predictors for SiLU/GELU models: guess which gate rows are worth reading.
# Owns: the two kinds and their exact run-time arithmetic (the numpy twin the C engine must match):
#   lowbit  — a 1- or 2-bit copy of the gate (`blk.L.ffn_gate_pred.weight`, format below) on x = ffn_norm(h);
#   lowrank — ĝ = fc2·(fc1·z) (no hidden activation), fc1 [n_embd→r], fc2 [r→n_ff] Q8_0, fitted by
#             reduced-rank least squares of the gate pre-activations on z (z = ffn_norm(h) or attn_norm of
#             the layer's input, which exists before attention starts);
#   the per-layer margins (one per keep-grid point) chosen on the calibration tokens for a target recall,
#   and the measurement (recall, neurons added, bytes) on held-out calibration tokens.
# Rule (both kinds): predicted_i ⇔ |act(ĝ_i)| > t_L − m_L, t_L and m_L interpolated at the layer's keep.
# Does not: profile (layerwise.py, profile.py), write files (writer.py), evaluate ĝ (pi2/reference/predictor.py)
# or run the FFN (pi2/reference/sparse_ffn.py).
#
# Low-bit row format (bits b ∈ {1, 2}, blocks of 32 weights along n_embd): per block, an f16 scale d, then
# 32 codes of b bits packed little-endian (code j at bit j·b of the block's code bytes);
# weight = d·(2c − (2^b − 1)).
# The dot product with x: x is quantized to Q8_0 per 32-block (d_x = amax/127 as f16, q = round-half-even(x·127/amax));
# per block sumi = Σ_j (2c_j − (2^b−1))·q_j (exact integer); ĝ = Σ_blocks in order, from 0.0f, of
# (float)sumi · ((float)d · (float)d_x) in float32.
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pi2.errors import UsageError
from pi2.model.gguf_file import TYPE_IDS
from pi2.model.ffn_layout import PRED_BLOCK, PRED_INPUTS, PRED_KINDS
from pi2.reference.predictor import LowbitGate, LowrankGate
from pi2.reference.quants import QuantLinear, quantize_weight
from pi2.runtime.ffn_rule import cut_at

KINDS, INPUTS = PRED_KINDS, PRED_INPUTS
DEFAULT_KIND = "lowbit"               # measured on SmolLM2 (scripts/predictor_compare.py): fewest gate rows read
DEFAULT_BITS = 2
DEFAULT_RANK = 64
TARGET_RECALL = 0.95                  # 0.99 predicts ~0.91 of SmolLM2's neurons at keep 0.5: no gate rows saved
BLOCK = PRED_BLOCK
Q8_0 = TYPE_IDS["Q8_0"]
HOLDOUT = 0.25                        # share of calibration tokens held out for the reported measurement


# ------------------------------------------------------------------ the low-bit gate copy

def lowbit_encode(w: np.ndarray, bits: int) -> np.ndarray:
    """float32 (rows, n) -> uint8 (rows, lowbit_row_bytes): per block the L2-best scale over a few candidates."""
    if bits not in (1, 2):
        raise UsageError(f"--predictor-bits must be 1 or 2 (got {bits})")
    rows, n = w.shape
    if n % BLOCK:
        raise UsageError(f"a low-bit predictor needs n_embd divisible by {BLOCK} (got {n})")
    L = (1 << bits) - 1
    xb = w.reshape(rows, n // BLOCK, BLOCK).astype(np.float32)
    amax = np.abs(xb).max(axis=-1, keepdims=True)
    best_err, best_d, best_c = None, None, None
    if bits == 1:
        cands = [np.abs(xb).mean(axis=-1, keepdims=True)]            # the L2-best scale of a sign code
    else:
        cands = [amax / L * f for f in np.linspace(0.4, 1.0, 13)]
    for d in cands:
        d = d.astype(np.float16).astype(np.float32)
        inv = np.divide(1.0, d, out=np.zeros_like(d), where=d != 0)
        c = np.clip(np.rint((xb * inv + L) / 2), 0, L).astype(np.uint8)
        e = ((d * (2.0 * c - L) - xb) ** 2).sum(axis=-1, keepdims=True)
        if best_err is None:
            best_err, best_d, best_c = e, d, c
        else:
            better = e < best_err
            best_err = np.where(better, e, best_err)
            best_d = np.where(better, d, best_d)
            best_c = np.where(better, c, best_c)
    codes = best_c.reshape(rows, n // BLOCK, BLOCK // (8 // bits), 8 // bits).astype(np.uint16)
    packed = (codes << (np.arange(8 // bits, dtype=np.uint16) * bits)).sum(axis=-1).astype(np.uint8)
    dbytes = best_d.astype(np.float16).view(np.uint8).reshape(rows, n // BLOCK, 2)
    return np.concatenate([dbytes, packed], axis=-1).reshape(rows, -1)


# ------------------------------------------------------------------ the low-rank model

def fit_lowrank(z: np.ndarray, g: np.ndarray, rank: int, ridge: float = 1e-3):
    """Reduced-rank least squares g ≈ z·B, rank(B) = r: (fc1 (r, n_embd), fc2 (n_ff, r)) float32;
    ĝ = fc2·(fc1·z)."""
    z64, g64 = z.astype(np.float64), g.astype(np.float64)
    zz = z64.T @ z64
    zz[np.diag_indices_from(zz)] += ridge * np.trace(zz) / zz.shape[0]
    B = np.linalg.solve(zz, z64.T @ g64)                       # (n_embd, n_ff)
    R = np.linalg.qr(z64, mode="r")                            # z = Q·R: the fit z·B = Q·(R·B) has R·B's
    _, _, vt = np.linalg.svd(R @ B, full_matrices=False)       # right singular vectors
    V = vt[:rank].T                                            # (n_ff, r)
    return (B @ V).T.astype(np.float32), V.astype(np.float32)


def lowrank_tensors(fc1: np.ndarray, fc2: np.ndarray):
    """Q8_0 bytes of fc1 (r, n_embd) and fc2 (n_ff, r) (r must be a multiple of 32)."""
    if fc1.shape[0] % BLOCK:
        raise UsageError(f"--predictor-rank must be a multiple of {BLOCK} (got {fc1.shape[0]})")
    return quantize_weight(fc1, Q8_0), quantize_weight(fc2, Q8_0)


# ------------------------------------------------------------------ margins and measurement

def margins(score: np.ndarray, act_abs: np.ndarray, thresh: np.ndarray, grid, target: float) -> np.ndarray:
    """m_k per grid keep k: the largest cut t_k − m_k that still catches `target` of the pairs with
    |act(gate)| > t_k. score = |act(ĝ)|. m_k = 0 at keep 1 (every neuron is computed there)."""
    out = np.zeros(len(grid), np.float32)
    for j, (k, t) in enumerate(zip(grid, thresh)):
        if k >= 1.0:
            continue
        s = score[act_abs > t]
        if s.size == 0:
            continue
        i = int(np.floor((s.size - 1) * (1.0 - target)))          # numpy's quantile, method "lower"
        q = np.float32(np.partition(s, i)[i])
        cut = np.nextafter(q, np.float32(-np.inf), dtype=np.float32)
        out[j] = np.float32(t) - cut
    return out


@dataclass
class Spec:
    kind: str = DEFAULT_KIND
    input: str = "ffn_norm"
    bits: int = DEFAULT_BITS
    rank: int = DEFAULT_RANK
    target: float = TARGET_RECALL


@dataclass
class Built:
    tensors: dict                       # name suffix -> (bytes (rows, row_bytes), ggml type or None for I8)
    margin: np.ndarray                  # (len(grid),) float32
    nbytes: int
    metrics: dict = field(default_factory=dict)


def _apply(spec: Spec, tensors: dict, n_embd: int):
    if spec.kind == "lowbit":
        return LowbitGate(tensors["ffn_gate_pred"][0], spec.bits, n_embd)
    (r1, _), (r2, _) = tensors["fc1"], tensors["fc2"]
    return LowrankGate(QuantLinear.from_raw(r1, Q8_0, n_embd), QuantLinear.from_raw(r2, Q8_0, r1.shape[0]))


def _make(spec: Spec, gate_w: np.ndarray, z: np.ndarray, g: np.ndarray) -> dict:
    if spec.kind == "lowbit":
        return {"ffn_gate_pred": (lowbit_encode(gate_w, spec.bits), None)}
    fc1, fc2 = fit_lowrank(z, g, spec.rank)
    r1, r2 = lowrank_tensors(fc1, fc2)
    return {"fc1": (r1, Q8_0), "fc2": (r2, Q8_0)}


def _scores(spec: Spec, lp, act, z, rows: slice | np.ndarray):
    """(tensors fitted on `rows`, |act(ĝ)| of every token): lowrank scores of the other tokens are out of fold."""
    tens = _make(spec, lp.gate_w, z[rows], lp.gate[rows])
    return tens, np.abs(act(_apply(spec, tens, z.shape[1])(z)))


def _margin_scores(spec: Spec, lp, act, z, n: int) -> np.ndarray:
    """|act(ĝ)| of the first n tokens as new tokens would see it: for lowrank, 2-fold out-of-fold scores (a fit
    on the tokens it scores is optimistic); lowbit has nothing fitted."""
    if spec.kind == "lowbit":
        return _scores(spec, lp, act, z[:n], slice(0, n))[1]
    h = n // 2
    s = np.empty((n, lp.gate.shape[1]), np.float32)
    s[h:n] = _scores(spec, lp, act, z[:n], slice(0, h))[1][h:n]
    s[:h] = _scores(spec, lp, act, z[:n], slice(h, n))[1][:h]
    return s


def build(spec: Spec, lp, act, thresh: np.ndarray, grid, keep: float, ud_bytes: float, gate_row_bytes: float,
          measure: bool = True) -> Built:
    """The predictor of one layer from its LayerPass: tensors (source neuron order) fitted on all calibration
    tokens, margins from out-of-fold scores, and (measure) recall / added / bytes / FFN error at `keep` on the
    last HOLDOUT of the tokens, with a predictor and margins made the same way from the rest."""
    if spec.kind not in KINDS:
        raise UsageError(f"unknown predictor '{spec.kind}' (choose from {', '.join(KINDS)})")
    if spec.input not in INPUTS:
        raise UsageError(f"unknown predictor input '{spec.input}' (choose from {', '.join(INPUTS)})")
    z = lp.x if spec.input == "ffn_norm" else lp.attn_in
    n_embd, n_all = z.shape[1], z.shape[0]
    a_abs = np.abs(lp.act)
    metrics = {}
    if measure:
        n_fit = int(round(n_all * (1 - HOLDOUT)))
        m = margins(_margin_scores(spec, lp, act, z, n_fit), a_abs[:n_fit], thresh, grid, spec.target)
        tens, s = _scores(spec, lp, act, z, slice(0, n_fit))
        cut, t = cut_at(thresh, m, grid, keep), np.float32(np.interp(keep, grid, thresh))
        A, P = a_abs[n_fit:] > t, s[n_fit:] > cut
        n_tok, n_act, n_pred = A.shape[0], int(A.sum()), int(P.sum())
        caught = int((A & P).sum())
        hh = (lp.act * lp.up)[n_fit:]
        y = hh @ lp.down.T
        ny = np.linalg.norm(y) or 1.0
        err = lambda mask: float(np.linalg.norm(np.where(mask, hh, 0) @ lp.down.T - y) / ny)  # noqa: E731
        nb = _apply(spec, tens, n_embd).nbytes
        metrics = {"recall": caught / max(n_act, 1), "keep": n_act / A.size, "predicted": n_pred / A.size,
                   "added": (n_pred - caught) / A.size, "pred_bytes": nb,
                   "bytes_tok": nb + (gate_row_bytes * n_pred + ud_bytes * caught) / n_tok,
                   "bytes_tok_gate": gate_row_bytes * A.shape[1] + ud_bytes * n_act / n_tok,
                   "err_gate": err(A), "err_pred": err(A & P)}
    m = margins(_margin_scores(spec, lp, act, z, n_all), a_abs, thresh, grid, spec.target)
    tens = _make(spec, lp.gate_w, z, lp.gate)
    return Built(tens, m, _apply(spec, tens, n_embd).nbytes, metrics)
