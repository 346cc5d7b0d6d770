"""expert_bundles.py — a converted MoE file's experts (`pi2 convert` of a ReLU-family MoE file): where each expert's
rows are, for the C engine (descriptors) and the numpy reference (weights), from the file's tables alone.

Layout of a layer with experts (pi2.experts.layout = bundle-ud), every expert's neurons in its own hot-first order:
  blk.L.ffn_gate_exps           the source's gate rows, permuted per expert (same type; exact);
  blk.L.ffn_bundle_exps         I8 bytes {W, n_ff_exp, n_expert}: neuron r of expert e's record = its up row (the
                                source's type, exact) at 0, then its down column as a row of pi2.experts.down_types[L]
                                at row_bytes(up), zero-padded to W (a multiple of 32); an expert's records contiguous;
  blk.L.ffn_down_scale_exps     F32 {n_ff_exp, n_expert}, blk.L.ffn_down_colscale_exps F32 {n_embd, n_expert}: the
                                scales of I8 down rows (pi2/reference/down_i8.py), per expert; only with I8 rows;
  blk.L.ffn_perm_exps           I32 {n_ff_exp, n_expert}: new neuron index -> the source's;
  blk.L.ffn_freq_exps           F32 {n_ff_exp, n_expert}: the share of an expert's routed calibration rows that
                                opened the neuron (gate > 0), descending within each expert;
  blk.L.ffn_routed_exps         F32 {n_expert}: calibration rows routed to each expert (the routing profile).
Down is summed as the dense pi2 file's down rows are (groups of 64 neurons in order): the file's logits are the
reference's for it, not the source file's (down is re-quantized along the neuron axis and summed in another order).
Does not: compute anything (reference/moe.py and moe_down_rows.py, csrc/ffn/moe_down_rows.c) or write the file (pi2/convert/moe.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pi2.errors import ModelFormatError
from pi2.model.ffn_layout import row_bytes
from pi2.model.gguf_file import GGML_TYPES, TYPE_IDS

LAYOUT = "bundle-ud"
ALIGN = 32
I8 = TYPE_IDS["I8"]
F32 = TYPE_IDS["F32"]


@dataclass(frozen=True)
class View:
    """Rows of one type inside a larger tensor: what a pi2_tensor_desc with a row stride says (engine/model.py)."""
    type: int
    ne: tuple
    offset: int
    nbytes: int
    row_stride: int


def layout(model, il: int) -> dict:
    """Layer il's record: up_type, down_type, down_offset (up at 0), width; ModelFormatError when inconsistent."""
    cfg, kv = model.config, model.file.kv
    t = model.tensor(f"blk.{il}.ffn_bundle_exps.weight")
    try:
        up_t, down_t = int(kv["pi2.experts.up_types"][il]), int(kv["pi2.experts.down_types"][il])
        GGML_TYPES[up_t], GGML_TYPES[down_t]
    except (KeyError, IndexError, TypeError, ValueError):
        raise ModelFormatError(f"{model.path}: pi2.experts.up_types / down_types do not describe layer {il}") from None
    nu, nd = row_bytes(up_t, cfg.n_embd), row_bytes(down_t, cfg.n_embd)
    width = int(t.ne[0])
    if width < nu + nd or width % ALIGN:
        raise ModelFormatError(f"{model.path}: layer {il}'s expert bundles of {width} bytes cannot hold an up row of "
                               f"{nu} and a down row of {nd} bytes")
    return {"up_type": up_t, "down_type": down_t, "down_offset": nu, "width": width}


def has_bundles(model, il: int) -> bool:
    return f"blk.{il}.ffn_bundle_exps.weight" in model.file.tensors


def scales(model, il: int) -> list:
    """[(name, tensor)] of layer il's I8 scales, checked against its down type."""
    cfg, b, lay = model.config, f"blk.{il}.", layout(model, il)
    out = []
    for name, n in (("ffn_down_scale_exps", cfg.n_ff_exp), ("ffn_down_colscale_exps", cfg.n_embd)):
        t = model.file.tensors.get(b + name + ".weight")
        if (t is None) == (lay["down_type"] == I8) or (t is not None and (t.type != F32 or
                                                                         tuple(t.ne) != (n, cfg.n_expert))):
            raise ModelFormatError(f"{model.path}: layer {il}'s {name} must be F32 [{n}, {cfg.n_expert}] exactly when "
                                   "its expert down rows are I8")
        if t is not None:
            out.append((name, t))
    return out


def descs(model, il: int, roles: dict) -> list:
    """(role, layer, View) of layer il's up rows, down rows and I8 scales for pi2_model_load."""
    cfg, lay = model.config, layout(model, il)
    t = model.tensor(f"blk.{il}.ffn_bundle_exps.weight")
    e, f, x, w = cfg.n_embd, cfg.n_ff_exp, cfg.n_expert, lay["width"]
    n = x * f
    out = [(roles["ffn_up_exps"], il, View(lay["up_type"], (e, f, x), t.offset,
                                           (n - 1) * w + row_bytes(lay["up_type"], e), w)),
           (roles["ffn_down_rows_exps"], il, View(lay["down_type"], (e, f, x), t.offset + lay["down_offset"],
                                                  (n - 1) * w + row_bytes(lay["down_type"], e), w))]
    for name, s in scales(model, il):
        out.append((roles[name], il, View(F32, (s.ne[0], 1, x), s.offset, s.nbytes, 0)))
    return out


def up_rows(model, il: int) -> tuple:
    """(contiguous up rows (n_expert·n_ff_exp, row bytes), their type) of layer il, copied out of the bundles."""
    cfg, lay = model.config, layout(model, il)
    rec = model.raw(f"blk.{il}.ffn_bundle_exps.weight").view(np.uint8).reshape(cfg.n_expert * cfg.n_ff_exp, -1)
    return np.ascontiguousarray(rec[:, :row_bytes(lay["up_type"], cfg.n_embd)]), lay["up_type"]
