"""ffn_rule.py — which FFN neurons a run computes: the active-set rule both engines get, chosen from the file.

Owns: FFNRule (the rule and its parameters: PowerInfer's predictor threshold, the calibrated per-layer thresholds
t_L and keep-fractions, the pi2-made predictor's kind, input and cuts t_L − m_L), the choice of a rule for a model
and the run's --keep / --dense / --predictor (choose_rule), and the spread of a model-wide keep over the layers
(uniform, or by the converter's error curves: allocate_keep).
Does not: compute an FFN (pi2/reference/sparse_ffn.py is what each rule means; csrc/ffn/ runs it) or count bytes
(pi2/model/ffn_layout.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pi2.errors import ModelFormatError, UsageError
from pi2.model.ffn_layout import PRED_INPUTS, PRED_KINDS, lowbit_row_bytes

RULES = ("dense", "predictor", "relu", "threshold", "predicted", "topk")
SCORES = ("act", "act_up")      # pi2.ffn.score: |act(gate)| or |act(gate)·up|
ALLOCATIONS = ("uniform", "error")


@dataclass
class FFNRule:
    """Which neurons a token computes, for every engine: rule is one of RULES; keep the model-wide keep
    (None: dense or rule-given); threshold PowerInfer's predictor threshold; score `act` or `act_up`;
    thresholds / layer_keep the calibrated per-layer t_L and keep-fractions (rules threshold, predicted); rule
    predicted: pred_kind / pred_input / pred_bits the pi2-made predictor (pi2/convert/predictor.py) and cuts the
    per-layer t_L − m_L."""
    rule: str
    keep: float | None = None
    threshold: float = 0.0
    score: str = "act"
    thresholds: np.ndarray | None = None
    layer_keep: np.ndarray | None = None
    pred_kind: str = ""
    pred_input: str = ""
    pred_bits: int = 0
    cuts: np.ndarray | None = None

    def describe(self) -> str:
        return {"dense": "dense FFN", "predictor": f"predictor (score >= {self.threshold:g})",
                "relu": "ReLU gate > 0", "threshold": f"calibrated thresholds at keep {self.keep:g}",
                "topk": f"per-token top {self.keep:g} of |act(gate)|",
                "predicted": f"pi2 predictor, then calibrated thresholds at keep {self.keep:g}"}[self.rule]


def choose_rule(model, keep: float | None = None, dense: bool = False, has_pred: bool | None = None,
                alloc: str = "uniform", use_predictor: bool = True) -> FFNRule:
    """The active-set rule of a run: --dense or keep 1 = dense; PowerInfer predictors; ReLU gates of sparse
    files; calibrated thresholds of pi2 files (at --keep, else the file's default keep), through the file's
    pi2-made predictor when use_predictor; per-token top-F for plain files with --keep. alloc: how a pi2 file's
    model-wide keep is spread over layers: `uniform` (every layer at keep, its own t_L) or `error` (allocate_keep
    on the converter's FFN error curves). Measured on SmolLM2 (pydoc topics, -c 512, 8 chunks, keep 0.7): uniform
    13.08, error 19.10 (it starves the layers whose relative error curves are flat to keep 0.05), halfway between
    13.47: uniform is the default."""
    cfg, kv = model.config, model.file.kv
    if keep is not None and not 0.0 < keep <= 1.0:
        raise UsageError(f"invalid --keep {keep:g}: it is a fraction of the FFN neurons in (0, 1]")
    threshold = float(kv.get("powerinfer.sparse_threshold", 0.0) or 0.0)
    score = str(kv.get("pi2.ffn.score", "act"))
    if score not in SCORES:
        raise ModelFormatError(f"pi2.ffn.score '{score}' is not one of {', '.join(SCORES)}")
    if has_pred is None:
        has_pred = all(f"blk.{il}.fc1.weight" in model.file.tensors and f"blk.{il}.fc2.weight" in model.file.tensors
                       for il in range(cfg.n_layer))
    relu = cfg.ffn_act in ("relu", "drelu")
    if cfg.moe_family:   # ReLU experts skip the up rows of closed gates (csrc/ffn/moe_relu.c: the same logits)
        return FFNRule("relu" if cfg.expert_act == "relu" and not dense else "dense", None, threshold, score)
    if keep is None:
        keep = float(kv.get("pi2.ffn.default_keep", 1.0)) if cfg.pi2 and not relu else None
    r = FFNRule("dense", keep, threshold, score)
    if dense or (keep is not None and keep >= 1.0):
        return r
    if cfg.sparse and has_pred:
        r.rule = "predictor"
        for il in range(cfg.n_layer):
            _check_fc(model, f"blk.{il}.")
    elif relu and (cfg.sparse or cfg.pi2):
        r.rule = "relu"
    elif keep is None:
        return r
    elif cfg.pi2:
        r.rule = "threshold"
        grid = np.asarray(kv["pi2.ffn.keep_grid"], np.float64)
        rows = {n: [model.raw(f"blk.{il}.{n}.weight").view(np.float32).reshape(-1) for il in range(cfg.n_layer)]
                for n in ("ffn_err", "ffn_thresh")}
        if any(x.size != len(grid) for v in rows.values() for x in v):     # checked before stacking them
            raise ModelFormatError(f"{model.path}: ffn_err/ffn_thresh need {len(grid)} values (pi2.ffn.keep_grid)")
        err, thr = np.stack(rows["ffn_err"]), np.stack(rows["ffn_thresh"])
        if alloc not in ALLOCATIONS:
            raise UsageError(f"unknown keep allocation '{alloc}' (choose from {', '.join(ALLOCATIONS)})")
        if keep < grid[0]:
            raise UsageError(f"--keep {keep:g} is below the smallest calibrated keep {grid[0]:g} of this file")
        r.layer_keep = allocate_keep(err, grid, keep) if alloc == "error" else np.full(cfg.n_layer, keep)
        r.thresholds = layer_thresholds(thr, grid, r.layer_keep)
        if use_predictor and "pi2.predictor.kind" in kv:   # a pi2-made predictor chooses the gate rows to read
            r.rule = "predicted"
            _predicted_setup(model, r, thr, grid)
    else:
        r.rule = "topk"
    return r


def cut_at(thresh: np.ndarray, margin: np.ndarray, grid, keep: float) -> np.float32:
    """The run-time cut t_L − m_L at a layer keep: both interpolated linearly (float64) then rounded to f32."""
    t = np.float32(np.interp(keep, grid, thresh))
    m = np.float32(np.interp(keep, grid, margin))
    return np.float32(t - m)


def _check_fc(model, b: str) -> None:
    """A predictor fc2·relu(fc1·h) must map n_embd -> r -> n_ff (PowerInfer's, or a pi2-made lowrank one)."""
    cfg, tensors = model.config, model.file.tensors
    (i1, o1), (i2, o2) = (tuple(tensors[b + n].ne[:2]) + (0,) * (2 - len(tensors[b + n].ne[:2]))
                          for n in ("fc1.weight", "fc2.weight"))
    if i1 != cfg.n_embd or o2 != cfg.n_ff or i2 != o1:
        raise ModelFormatError(f"{model.path}: {b}fc1/fc2 must map n_embd {cfg.n_embd} -> r -> n_ff "
                               f"{cfg.n_ff} (got {i1} -> {o1}, {i2} -> {o2})")


def _predicted_setup(model, r: FFNRule, thr: np.ndarray, grid: np.ndarray) -> None:
    """r's pi2-made predictor (kind, input, bits) and every layer's cut t_L − m_L at its allocated keep, after
    checking the file has the predictor's tensors in the shapes the kind needs."""
    kv, cfg, tensors = model.file.kv, model.config, model.file.tensors
    r.pred_kind, r.pred_input = str(kv["pi2.predictor.kind"]), str(kv.get("pi2.predictor.input", ""))
    if r.pred_kind not in PRED_KINDS or r.pred_input not in PRED_INPUTS:
        raise ModelFormatError(f"{model.path}: pi2.predictor.kind/input '{r.pred_kind}'/'{r.pred_input}' "
                               f"is not one of {'|'.join(PRED_KINDS)} / {'|'.join(PRED_INPUTS)}")
    r.pred_bits = int(kv.get("pi2.predictor.bits", 0)) if r.pred_kind == "lowbit" else 0
    cuts = []
    for il in range(cfg.n_layer):
        b = f"blk.{il}."
        need = [b + "ffn_pred_margin.weight"] + ([b + "ffn_gate_pred.weight"] if r.pred_kind == "lowbit"
                                                  else [b + "fc1.weight", b + "fc2.weight"])
        missing = [n for n in need if n not in tensors]
        if missing:
            raise ModelFormatError(f"{model.path}: the {r.pred_kind} predictor needs tensor {missing[0]}",
                                   hint="convert the model again, or run with --no-predictor")
        margin = model.raw(b + "ffn_pred_margin.weight").view(np.float32).reshape(-1)
        if margin.size != len(grid) or not np.isfinite(margin).all():
            raise ModelFormatError(f"{model.path}: {b}ffn_pred_margin needs {len(grid)} finite values "
                                   f"(pi2.ffn.keep_grid)")
        if r.pred_kind == "lowbit":
            shape = tuple(tensors[b + "ffn_gate_pred.weight"].ne[::-1])
            if r.pred_bits not in (1, 2) or shape != (cfg.n_ff, lowbit_row_bytes(cfg.n_embd, r.pred_bits)):
                raise ModelFormatError(f"{model.path}: {b}ffn_gate_pred must be {cfg.n_ff} rows of "
                                       f"{lowbit_row_bytes(cfg.n_embd, max(r.pred_bits, 1))} bytes with "
                                       f"pi2.predictor.bits 1 or 2 (got {shape}, bits {r.pred_bits})")
        else:
            _check_fc(model, b)
        cuts.append(cut_at(thr[il], margin, grid, r.layer_keep[il]))
    r.cuts = np.array(cuts, np.float32)


# ------------------------------------------------------------------ allocation of a model-wide keep

def _lower_hull(x: np.ndarray, y: np.ndarray) -> list:
    """Indices of the lower convex hull of the points (x[i], y[i]), x increasing."""
    hull: list = []
    for i in range(len(x)):
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            if (y[b] - y[a]) * (x[i] - x[a]) >= (y[i] - y[a]) * (x[b] - x[a]):
                hull.pop()
            else:
                break
        hull.append(i)
    return hull


def allocate_keep(err: np.ndarray, grid: np.ndarray, keep: float) -> np.ndarray:
    """Per-layer keep fractions with mean `keep` that minimise the summed error, err (n_layer, len(grid)) being
    each layer's FFN error at the grid's keep fractions (piecewise linear in between). Greedy marginal
    allocation on each curve's lower convex hull (the Lagrangian optimum): every layer starts at grid[0]
    and the budget goes to the hull segments with the steepest error drop per unit of keep first, so layers
    with flat curves keep fewer neurons."""
    err, grid = np.asarray(err, np.float64), np.asarray(grid, np.float64)
    n_layer = err.shape[0]
    if len(grid) == 0 or np.any(np.diff(grid) <= 0):
        raise ModelFormatError("pi2.ffn.keep_grid must be a non-empty increasing list")
    if keep >= grid[-1]:
        return np.full(n_layer, min(keep, 1.0))
    if keep < grid[0]:
        raise UsageError(f"--keep {keep:g} is below the smallest calibrated keep {grid[0]:g} of this file")
    segs = []
    for il in range(n_layer):
        h = _lower_hull(grid, err[il])
        for j, (a, b) in enumerate(zip(h, h[1:])):
            segs.append(((err[il, b] - err[il, a]) / (grid[b] - grid[a]), il, j, grid[b] - grid[a]))
    out = np.full(n_layer, grid[0])
    budget = n_layer * (keep - grid[0])
    for _, il, _, length in sorted(segs):
        take = min(length, budget)
        out[il] += take
        budget -= take
        if budget <= 0:
            break
    return out


def layer_thresholds(thresh: np.ndarray, grid: np.ndarray, keeps: np.ndarray) -> np.ndarray:
    """t_L interpolated (linearly) in each layer's threshold table at its allocated keep."""
    return np.array([np.interp(k, grid, thresh[il]) for il, k in enumerate(keeps)], np.float32)


# The activation frequency from which a neuron's up row is cheaper computed for every token with the dense kernels
# (x8 layout, eight rows per call) than only when active from its own row (four scattered rows per call): the dense
# kernel costs about half as much per row (AMD EPYC Zen 4: csrc/ffn/sparse.c, docs/sparse-kernels.md).
PREFIX_FREQ = 0.5


def dense_prefix(model, rule: FFNRule) -> list:
    """Per layer, how many of a pi2 file's first (hottest) neurons one token computes the up rows of whole, for the
    threshold and top-k rules: the longest prefix whose activation frequency (blk.L.ffn_freq, measured at the file's
    default keep, scaled to the layer's keep) is at least PREFIX_FREQ; 0 for other files and rules."""
    kv = model.file.kv
    if not model.config.pi2 or rule.rule not in ("threshold", "topk") or "pi2.ffn.default_keep" not in kv:
        return []
    default = float(kv["pi2.ffn.default_keep"])
    out = []
    for il in range(model.config.n_layer):
        freq = np.asarray(model.raw(f"blk.{il}.ffn_freq.weight")).view(np.float32).ravel()
        keep = float(rule.layer_keep[il]) if rule.layer_keep is not None else float(rule.keep or default)
        low = np.minimum.accumulate(freq * np.float32(keep / default)) < PREFIX_FREQ
        out.append(int(np.argmax(low)) if low.any() else int(freq.size))
    return out
