"""sparse.py — the sparse FFN of the numpy reference: which neurons a token activates, and the FFN over them.

Owns: the active-set rules (predictor score >= threshold, ReLU gate > 0, |act(gate)| > t_L, the pi2-made
predictor's `predicted` rule (gate rows only for the predicted set P, active = P ∩ {|act(gate)| > t_L}), and the
on-the-fly top-F fraction per token for plain GGUF files), the allocation of a model-wide keep-fraction across layers
from the pi2 file's error curves, reading a layer's FFN weights (dense GGUF, PowerInfer `ffn_down_t`, pi2
bundles), and the count of FFN weight bytes each token touches.
The FFN over active neurons is llama.cpp's dense FFN with the inactive neurons' h = act(gate)·up set to 0
(gate and up rows are the same quantized dot products); with every neuron active it is the dense FFN bit
for bit. Down stored as rows (PowerInfer, pi2) is the axpy y = Σ_i h_i·down_row_i in float32.
One module on purpose: it is the specification csrc/ffn_*.c are tested against, rules and FFN read together.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pi2 import ggml_order as go
from pi2.down_i8 import I8Rows, axpy_rows_i8
from pi2.errors import ModelFormatError, UsageError
from pi2.model.gguf_file import GGML_TYPES, TYPE_IDS
from pi2.quants import QuantLinear, dequantize

I8 = TYPE_IDS["I8"]             # int8 down rows with per-row scales (pi2/down_i8.py)
SCORES = ("act", "act_up")      # pi2.ffn.score: |act(gate)| or |act(gate)·up|


def row_bytes(qtype: int, n: int) -> int:
    _, block, size = GGML_TYPES[qtype]
    return n // block * size


# ------------------------------------------------------------------ active-set rules

def predictor_scores(h_pre: np.ndarray, fc1: QuantLinear, fc2: QuantLinear) -> np.ndarray:
    """PowerInfer's predictor: raw scores fc2·relu(fc1·h_pre), no sigmoid; h_pre is the residual before ffn_norm."""
    return fc2(np.maximum(fc1(h_pre), np.float32(0)))


def predictor_mask(h_pre, fc1, fc2, threshold: float = 0.0) -> np.ndarray:
    """Active iff score >= threshold (0.0 is sigmoid >= 0.5)."""
    return predictor_scores(h_pre, fc1, fc2) >= np.float32(threshold)


def relu_mask(gate: np.ndarray) -> np.ndarray:
    """ReLU-family models: active iff gate > 0 (the others contribute exactly 0)."""
    return gate > 0


def act_values(gate: np.ndarray, act: str) -> np.ndarray:
    """act(gate) as the dense FFN computes it (ggml's SiLU, GELU through F16, ReLU)."""
    if act == "silu":
        return go.v_silu(gate)
    if act == "gelu":
        from pi2.reference import gelu_f16
        return gelu_f16(gate)
    return np.maximum(gate, np.float32(0))


def threshold_mask(score: np.ndarray, t: float) -> np.ndarray:
    """CATS-style rule: active iff |score| > t (score = act(gate), or act(gate)·up)."""
    return np.abs(score) > np.float32(t)


def topk_mask(score: np.ndarray, keep: float) -> np.ndarray:
    """The top ceil(keep·n) neurons of each token by |score| (ties: lower index first): the threshold t_L
    computed on the fly per token and layer, for files without calibrated thresholds."""
    n = score.shape[-1]
    k = min(n, max(1, math.ceil(keep * n - 1e-9)))
    order = np.argsort(-np.abs(score), axis=-1, kind="stable")[..., :k]
    mask = np.zeros(score.shape, bool)
    np.put_along_axis(mask, order, True, axis=-1)
    return mask


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


# ------------------------------------------------------------------ a layer's FFN weights

def _rows(raw: np.ndarray, qtype: int, n: int) -> QuantLinear:
    return QuantLinear.from_raw(np.ascontiguousarray(raw), qtype, n)


def ffn_weights(model, il: int) -> dict:
    """A layer's FFN as the reference reads it: ffn_gate / ffn_up (QuantLinear, neuron rows), then either
    ffn_down (QuantLinear, dense GGUF) or down_rows (QuantLinear whose row i is neuron i's output), and
    fc1 / fc2 when the layer has a predictor. pi2 files: gate, up and down rows come from the bundle."""
    cfg, f = model.config, model.file
    b, e = f"blk.{il}.", cfg.n_embd
    lin = lambda name: _rows(model.raw(name), model.tensor(name).type, model.tensor(name).ne[0])  # noqa: E731
    L: dict = {}
    if b + "fc1.weight" in f.tensors and b + "fc2.weight" in f.tensors:
        L["fc1"], L["fc2"] = lin(b + "fc1.weight"), lin(b + "fc2.weight")
    if not cfg.pi2:
        L["ffn_gate"], L["ffn_up"] = lin(b + "ffn_gate.weight"), lin(b + "ffn_up.weight")
        if cfg.sparse or cfg.ffn_down_t:
            L["down_rows"] = lin(b + "ffn_down_t.weight")
        else:
            L["ffn_down"] = lin(b + "ffn_down.weight")
        return L
    lay = bundle_layout(model, il)
    rec = model.raw(b + "ffn_bundle.weight")
    if lay["gate_type"] is not None:
        L["ffn_gate"] = _rows(rec[:, :lay["up_offset"]], lay["gate_type"], e)
    else:
        L["ffn_gate"] = lin(b + "ffn_gate.weight")
    nu, nd = row_bytes(lay["up_type"], e), row_bytes(lay["down_type"], e)
    L["ffn_up"] = _rows(rec[:, lay["up_offset"]:lay["up_offset"] + nu], lay["up_type"], e)
    drows = rec[:, lay["down_offset"]:lay["down_offset"] + nd]
    if lay["down_type"] == I8:
        sc = []
        for name, n in (("ffn_down_scale", cfg.n_ff), ("ffn_down_colscale", e)):
            if b + name + ".weight" not in f.tensors:
                raise ModelFormatError(f"{model.path}: layer {il}'s int8 down rows need {b}{name}.weight")
            sc.append(model.raw(b + name + ".weight").view(np.float32).reshape(-1))
            if sc[-1].size != n or not np.isfinite(sc[-1]).all():
                raise ModelFormatError(f"{model.path}: {b}{name} must hold {n} finite floats")
        L["down_rows"] = I8Rows(drows, *sc)
    else:
        L["down_rows"] = _rows(drows, lay["down_type"], e)
    L["bundle_bytes"] = rec.shape[1]
    return L


def bundle_layout(model, il: int) -> dict:
    """Where a pi2 file's layer il keeps its rows inside each ffn_bundle record: gate_type (None when the
    gate rows are the separate ffn_gate tensor), up_type, down_type, up_offset, down_offset, width (bytes)."""
    cfg, f = model.config, model.file
    kv, b, e = f.kv, f"blk.{il}.", cfg.n_embd
    width = model.tensor(b + "ffn_bundle.weight").ne[0]
    try:
        down_t = int(kv["pi2.ffn.down_types"][il])
        gud = cfg.ffn_layout == "bundle-gud"
        if "pi2.ffn.up_types" in kv:
            up_t = int(kv["pi2.ffn.up_types"][il])
            gate_t = int(kv["pi2.ffn.gate_types"][il]) if gud else None
        else:       # not recorded: the gate's type, or the source type whose rows fill the record
            up_t = _bundle_type(f, width, row_bytes(down_t, e), e, gud) if gud else \
                model.tensor(b + "ffn_gate.weight").type
            gate_t = up_t if gud else None
    except (KeyError, IndexError, TypeError):
        raise ModelFormatError(f"{model.path}: pi2.ffn.down_types/up_types (and gate_types for bundle-gud) "
                               f"must give a type for layer {il}") from None
    for t in (down_t, up_t) + ((gate_t,) if gate_t is not None else ()):
        if t not in GGML_TYPES or e % GGML_TYPES[t][1]:
            raise ModelFormatError(f"{model.path}: layer {il}'s bundle names ggml type {t}, which cannot hold "
                                   f"rows of {e} values")
    off = row_bytes(gate_t, e) if gate_t is not None else 0
    nu, nd = row_bytes(up_t, e), row_bytes(down_t, e)
    if off + nu + nd > width:
        raise ModelFormatError(f"{model.path}: {b}ffn_bundle records of {width} bytes cannot hold "
                               f"their rows ({off + nu + nd} bytes)")
    return {"gate_type": gate_t, "up_type": up_t, "down_type": down_t, "up_offset": off,
            "down_offset": off + nu, "width": width}


def _bundle_type(f, width: int, down_bytes: int, e: int, gud: bool) -> int:
    """The weight type (among the file's) whose gate and up rows, with the down row, pad to `width` bytes."""
    for t in sorted({t.type for t in f.tensors.values()}):
        if t in GGML_TYPES and GGML_TYPES[t][1] <= e and e % GGML_TYPES[t][1] == 0:
            n = (2 if gud else 1) * row_bytes(t, e) + down_bytes
            if n <= width < n + 32 and width % 32 == 0:
                return t
    raise KeyError("pi2.ffn.up_types")


def _nbytes(q) -> int:
    return int(q.nbytes) if isinstance(q, I8Rows) else int(q.raw.nbytes)


RULES = ("dense", "predictor", "relu", "threshold", "predicted", "topk")
GROUP = 64   # neurons per partial sum of the down-row product (PI2_FFN_GROUP in csrc/pi2.h)


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


ALLOCATIONS = ("uniform", "error")


def choose_rule(model, keep: float | None = None, dense: bool = False, has_pred: bool | None = None,
                alloc: str = "uniform", use_predictor: bool = True) -> FFNRule:
    """The active-set rule of a run: --dense or keep 1 = dense; PowerInfer predictors; ReLU gates of sparse
    files; calibrated thresholds of pi2 files (at --keep, else the file's default keep); per-token top-F
    for plain files with --keep. alloc: how a pi2 file's model-wide keep is spread over layers: `uniform`
    (every layer at keep, its own t_L) or `error` (allocate_keep on the converter's FFN error curves). Measured
    on SmolLM2 (pydoc topics, -c 512, 8 chunks, keep 0.7): uniform 13.08, error 19.10 (it starves the layers
    whose relative error curves are flat to keep 0.05), halfway between 13.47: uniform is the default."""
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
    from pi2.convert import predictor as pr
    kv, cfg, tensors = model.file.kv, model.config, model.file.tensors
    r.pred_kind, r.pred_input = str(kv["pi2.predictor.kind"]), str(kv.get("pi2.predictor.input", ""))
    if r.pred_kind not in pr.KINDS or r.pred_input not in pr.INPUTS:
        raise ModelFormatError(f"{model.path}: pi2.predictor.kind/input '{r.pred_kind}'/'{r.pred_input}' "
                               f"is not one of {'|'.join(pr.KINDS)} / {'|'.join(pr.INPUTS)}")
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
            if r.pred_bits not in (1, 2) or shape != (cfg.n_ff, pr.lowbit_row_bytes(cfg.n_embd, r.pred_bits)):
                raise ModelFormatError(f"{model.path}: {b}ffn_gate_pred must be {cfg.n_ff} rows of "
                                       f"{pr.lowbit_row_bytes(cfg.n_embd, max(r.pred_bits, 1))} bytes with "
                                       f"pi2.predictor.bits 1 or 2 (got {shape}, bits {r.pred_bits})")
        else:
            _check_fc(model, b)
        cuts.append(pr.cut_at(thr[il], margin, grid, r.layer_keep[il]))
    r.cuts = np.array(cuts, np.float32)


def predictor_bytes(model, il: int, kind: str) -> int:
    """Bytes of layer il's pi2-made predictor of `kind` (lowbit: the gate copy; lowrank: fc1 and fc2)."""
    names = ("ffn_gate_pred.weight",) if kind == "lowbit" else ("fc1.weight", "fc2.weight")
    return sum(model.file.tensors[f"blk.{il}.{n}"].nbytes for n in names)


def layer_bytes(model, il: int) -> tuple:
    """(predictor bytes, gate bytes per neuron, up+down bytes per neuron, n_ff) of layer il, from the file's
    tensor table (no weights read)."""
    f, b, n_ff = model.file, f"blk.{il}.", model.config.n_ff
    size = lambda name: f.tensors[b + name].nbytes if b + name in f.tensors else 0  # noqa: E731
    pred = size("fc1.weight") + size("fc2.weight")
    if model.config.pi2:
        lay, e = bundle_layout(model, il), model.config.n_embd
        gate = row_bytes(lay["gate_type"], e) * n_ff if lay["gate_type"] is not None else size("ffn_gate.weight")
        ud = (row_bytes(lay["up_type"], e) + row_bytes(lay["down_type"], e)) * n_ff + size("ffn_down_scale.weight") \
            + size("ffn_down_colscale.weight")
    else:
        gate = size("ffn_gate.weight")
        ud = size("ffn_up.weight") + size("ffn_down.weight") + size("ffn_down_t.weight")
    return pred, gate // n_ff, ud // n_ff, n_ff


def bytes_touched(rule: str, lb: tuple, n_tok: int, n_act: int, n_gate: int | None = None) -> int:
    """FFN weight bytes n_tok tokens read in a layer with byte table lb (layer_bytes) and n_act active
    (token, neuron) pairs: predictor + gate rows (all; the active ones under a PowerInfer predictor; the
    n_gate predicted ones under a pi2-made predictor) + up/down."""
    pred, gate_b, ud_b, n_ff = lb
    if rule == "dense":
        return (gate_b + ud_b) * n_ff * n_tok
    if rule == "predicted":
        return pred * n_tok + gate_b * n_gate + ud_b * n_act
    return pred * n_tok + gate_b * (n_act if rule == "predictor" else n_ff * n_tok) + ud_b * n_act


class SparseFFN:
    """How one context computes its FFN layers, and what it has touched (for `pi2 bench`).

    rule: dense | predictor | relu | threshold (pi2 file, calibrated t_L) | predicted (pi2 file with a pi2-made
    predictor: P = {|act(ĝ)| > t_L − m_L}, active = P ∩ {|act(gate)| > t_L}) | topk (per-token top-F)."""

    def __init__(self, model, layers: list, keep: float | None = None, dense: bool = False,
                 use_predictor: bool = True):
        self.cfg, self.act = model.config, model.config.ffn_act
        r = choose_rule(model, keep, dense, all("fc1" in L for L in layers), use_predictor=use_predictor)
        self.spec = r
        self.rule, self.keep, self.threshold, self.score = r.rule, r.keep, r.threshold, r.score
        self.thresholds, self.layer_keep = r.thresholds, r.layer_keep
        if self.rule == "predicted":
            self._setup_predicted(model, layers)
        self._row_bytes = [self._bytes(L) for L in layers]
        if self.rule == "predicted":
            self._row_bytes = [(p.nbytes,) + r[1:] for p, r in zip(self._pred, self._row_bytes)]
        self.n_tokens = self.n_active = self.n_predicted = 0
        self.bytes = 0
        # the specification of --npu's hot prefix (csrc/npu_ffn.c): [n_layer] counts, or None; a single token
        # computes every neuron below npu_hot[il] (the NNAPI graph's dense hot part) and the rule's active ones above
        self.npu_hot = None

    def _setup_predicted(self, model, layers) -> None:
        """The pi2-made predictor of every layer (choose_rule checked its tensors and made the cuts)."""
        from pi2.convert import predictor as pr
        r, cfg = self.spec, self.cfg
        self.pred_kind, self.pred_input = r.pred_kind, r.pred_input
        self._pred, self.cuts, self._attn_in = [], list(r.cuts), None
        for il, L in enumerate(layers):
            if self.pred_kind == "lowbit":
                p = pr.LowbitGate(model.raw(f"blk.{il}.ffn_gate_pred.weight"), r.pred_bits, cfg.n_embd)
            else:
                p = pr.LowrankGate(L["fc1"], L["fc2"])
            self._pred.append(p)

    def note_attn_input(self, il: int, z: np.ndarray) -> None:
        """attn_norm of the layer's input, kept for a predictor that reads it (pi2.predictor.input attn_input)."""
        if self.rule == "predicted" and self.pred_input == "attn_input":
            self._attn_in = z

    @staticmethod
    def _bytes(L: dict) -> tuple:
        """(predictor bytes, gate row bytes, up+down bytes per neuron, n_ff) of one layer."""
        g = L["ffn_gate"]
        down = L["down_rows"] if "down_rows" in L else L["ffn_down"]
        pred = _nbytes(L["fc1"]) + _nbytes(L["fc2"]) if "fc1" in L else 0
        return pred, _nbytes(g) // g.n_out, (_nbytes(L["ffn_up"]) + _nbytes(down)) // g.n_out, g.n_out

    def __call__(self, il: int, L: dict, x: np.ndarray, h_pre: np.ndarray, trace=lambda name, t: None):
        """The FFN of layer il on x = ffn_norm(h_pre)."""
        if il == 0:
            self.n_tokens += x.shape[0]
        g, u = L["ffn_gate"](x), L["ffn_up"](x)
        trace("ffn_gate", g)
        trace("ffn_up", u)
        h = combine(g, u, self.act)
        trace("ffn_swiglu", h)
        n_ff = self._row_bytes[il][3]
        if self.rule == "dense":
            mask, n_act = None, n_ff * x.shape[0]
        elif self.rule == "predicted":
            z = x if self.pred_input == "ffn_norm" else self._attn_in
            P = np.abs(act_values(self._pred[il](z), self.act)) > self.cuts[il]
            trace("ffn_pred", P)
            mask = P & threshold_mask(act_values(g, self.act), self.thresholds[il])    # gate rows of P only
            n_act = int(mask.sum())
            self.n_predicted += int(P.sum())
            n_gate = int(P.sum())
            h = np.where(mask, h, np.float32(0))
            trace("ffn_mask", mask)
        else:
            if self.rule == "predictor":
                mask = predictor_mask(h_pre, L["fc1"], L["fc2"], self.threshold)
            else:
                mask = self._mask_from(il, g, h)
            n_act = int(mask.sum())
            if self.npu_hot is not None and x.shape[0] == 1:
                mask = mask.copy()
                mask[:, :self.npu_hot[il]] = True
            h = np.where(mask, h, np.float32(0))
            trace("ffn_mask", mask)
        self.bytes += bytes_touched(self.rule, self._row_bytes[il], x.shape[0], n_act,
                                    n_gate if self.rule == "predicted" else None)
        self.n_active += n_act
        if "ffn_down" in L:
            return L["ffn_down"](h)
        if isinstance(L["down_rows"], I8Rows):
            return axpy_rows_i8(h, L["down_rows"], GROUP)
        return axpy_rows(h, L["down_rows"])

    def _mask_from(self, il: int, g, h):
        if self.rule == "relu":
            return relu_mask(g)
        score = h if self.score == "act_up" and self.rule == "threshold" else act_values(g, self.act)
        if self.rule == "threshold":
            return threshold_mask(score, self.thresholds[il])
        return topk_mask(score, self.keep)

    def stats(self) -> dict:
        """Mean keep-fraction over every (token, layer) and FFN weight bytes touched per token."""
        n = max(self.n_tokens, 1)
        total = sum(r[3] for r in self._row_bytes) * n
        out = {"ffn_keep": round(self.n_active / total, 6) if self.n_tokens else (1.0 if self.rule == "dense" else 0.0),
               "ffn_bytes_per_token": int(round(self.bytes / n))}
        if self.rule == "predicted":
            out["ffn_predicted"] = round(self.n_predicted / total, 6) if self.n_tokens else 0.0
        return out

    def describe(self) -> str:
        return self.spec.describe()


def combine(g: np.ndarray, u: np.ndarray, act: str) -> np.ndarray:
    """h = act(gate)·up as the dense FFN computes it; drelu (bamboo): relu(gate)·relu(up)."""
    if act == "silu":
        return go.swiglu(g, u)
    if act == "gelu":
        from pi2.reference import gelu_f16
        return gelu_f16(g) * u
    z = np.float32(0)
    return np.maximum(g, z) * (np.maximum(u, z) if act == "drelu" else u)


def axpy_rows(h: np.ndarray, down: QuantLinear) -> np.ndarray:
    """y = Σ_i h_i·down_row_i in float32, in the order csrc/pi2.h gives for FFN_DOWN_ROWS: neurons in groups
    of GROUP; a group's partial sum starts at +0 and adds the products h_i·v_i of its neurons with h_i != 0
    in ascending order (v_i = the row's dequantized values); y starts at +0 and adds the groups' partial
    sums in ascending order. (Neurons with h_i = 0 would only add ±0, which changes nothing.)"""
    if getattr(down, "_rows_f32", None) is None:
        down._rows_f32 = dequantize(down.raw, down.qtype, down.n_in)
    rows, zero = down._rows_f32, np.float32(0)
    y = np.zeros((h.shape[0], down.n_in), np.float32)
    for t in range(h.shape[0]):
        nz = np.flatnonzero(h[t])
        if not nz.size:
            continue
        prods = h[t, nz, None] * rows[nz]
        cuts = np.flatnonzero(np.diff(nz // GROUP)) + 1
        parts = [np.add.accumulate(g, axis=0)[-1] + zero for g in np.split(prods, cuts)]
        y[t] = np.add.accumulate(np.stack(parts), axis=0)[-1] + zero
    return y
