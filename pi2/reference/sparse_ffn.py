"""sparse_ffn.py — the sparse FFN of the numpy reference: what each active-set rule means, and the FFN over the
active neurons.

Owns: the masks of the rules (predictor score >= threshold, ReLU gate > 0, |act(gate)| > t_L, the pi2-made
predictor's `predicted` rule (gate rows only for the predicted set P, active = P ∩ {|act(gate)| > t_L}), the
per-token top-F for plain GGUF files), reading a layer's FFN weights (dense GGUF, PowerInfer `ffn_down_t`, pi2
bundles), and the FFN over the active neurons with the bytes it touched.
The FFN over active neurons is llama.cpp's dense FFN with the inactive neurons' h = act(gate)·up set to 0
(gate and up rows are the same quantized dot products); with every neuron active it is the dense FFN bit
for bit. Down stored as rows (PowerInfer, pi2) is the axpy y = Σ_i h_i·down_row_i in float32; Q4_1 and Q5_1 rows
are summed in integers with 8-bit activations (down_qx1.py), int8 rows likewise (down_i8.py).
It is the specification csrc/ffn/ is tested against. Does not: choose the rule (pi2/runtime/ffn_rule.py, the same
for both engines) or parse the bundle layout (pi2/model/ffn_layout.py).
"""
from __future__ import annotations

import math

import numpy as np

from pi2.errors import ModelFormatError
from pi2.model.ffn_layout import bundle_layout, bytes_touched, row_bytes
from pi2.model.gguf_file import TYPE_IDS
from pi2.reference import ggml_order as go
from pi2.reference.down_i8 import I8Rows, axpy_rows_i8
from pi2.reference.down_qx1 import QX1_TYPES, axpy_rows_qx1
from pi2.reference.predictor import LowbitGate, LowrankGate
from pi2.reference.quants import QuantLinear, dequantize

I8 = TYPE_IDS["I8"]             # int8 down rows with per-row scales (pi2/reference/down_i8.py)
GROUP = 64   # neurons per partial sum of the down-row product (PI2_FFN_GROUP in csrc/pi2.h)


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
        return go.gelu_f16(gate)
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


def _nbytes(q) -> int:
    return int(q.nbytes) if isinstance(q, I8Rows) else int(q.raw.nbytes)


class SparseFFN:
    """How one context computes its FFN layers, and what it has touched (for `pi2 bench`).

    rule: dense | predictor | relu | threshold (pi2 file, calibrated t_L) | predicted (pi2 file with a pi2-made
    predictor: P = {|act(ĝ)| > t_L − m_L}, active = P ∩ {|act(gate)| > t_L}) | topk (per-token top-F)."""

    def __init__(self, model, layers: list, rule):
        """rule: the run's runtime.ffn_rule.FFNRule (copied: tests adjust the copy's fields)."""
        self.cfg, self.act = model.config, model.config.ffn_act
        r = self.spec = rule
        self.rule, self.keep, self.threshold, self.score = r.rule, r.keep, r.threshold, r.score
        self.thresholds, self.layer_keep = r.thresholds, r.layer_keep
        if self.rule == "predicted":
            self._setup_predicted(model, layers)
        self._row_bytes = [self._bytes(L) for L in layers]
        if self.rule == "predicted":
            self._row_bytes = [(p.nbytes,) + r[1:] for p, r in zip(self._pred, self._row_bytes)]
        self.n_tokens = self.n_active = self.n_predicted = 0
        self.bytes = 0
        # the specification of --npu's hot prefix (csrc/nnapi/hot_ffn.c): [n_layer] counts, or None; a single token
        # computes every neuron below npu_hot[il] (the NNAPI graph's dense hot part) and the rule's active ones above
        self.npu_hot = None

    def _setup_predicted(self, model, layers) -> None:
        """The pi2-made predictor of every layer (choose_rule checked its tensors and made the cuts)."""
        r, cfg = self.spec, self.cfg
        self.pred_kind, self.pred_input = r.pred_kind, r.pred_input
        self._pred, self.cuts, self._attn_in = [], list(r.cuts), None
        for il, L in enumerate(layers):
            if self.pred_kind == "lowbit":
                p = LowbitGate(model.raw(f"blk.{il}.ffn_gate_pred.weight"), r.pred_bits, cfg.n_embd)
            else:
                p = LowrankGate(L["fc1"], L["fc2"])
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
        return go.gelu_f16(g) * u
    z = np.float32(0)
    return np.maximum(g, z) * (np.maximum(u, z) if act == "drelu" else u)


def axpy_rows(h: np.ndarray, down: QuantLinear) -> np.ndarray:
    """y = Σ_i h_i·down_row_i in float32, in the order csrc/pi2.h gives for FFN_DOWN_ROWS: neurons in groups
    of GROUP; a group's partial sum starts at +0 and adds the products h_i·v_i of its neurons with h_i != 0
    in ascending order (v_i = the row's dequantized values); y starts at +0 and adds the groups' partial
    sums in ascending order. (Neurons with h_i = 0 would only add ±0, which changes nothing.)
    Q4_1 and Q5_1 rows: each group's part as down_qx1.py computes it, in integers."""
    if down.qtype in QX1_TYPES:
        return axpy_rows_qx1(h, down.raw, down.qtype, down.n_in, GROUP)
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
