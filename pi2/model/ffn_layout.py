"""ffn_layout.py — where a model's FFN rows are and how many bytes they take, from the file's tables alone.

Owns: a pi2 file's bundle layout (which row types sit at which offset of each `ffn_bundle` record), the format
facts of pi2-made predictors (kinds, inputs, the low-bit rows' size), a layer's byte table (predictor, gate row,
up + down per neuron), and the FFN weight bytes a token reads under each active-set rule.
Does not: read weights (only tensor tables and metadata) or choose a rule (pi2/runtime/ffn_rule.py).
"""
from __future__ import annotations

from pi2.errors import ModelFormatError
from pi2.model.gguf_file import GGML_TYPES

PRED_KINDS = ("lowbit", "lowrank")          # pi2.predictor.kind: a low-bit gate copy, or fc2·(fc1·z)
PRED_INPUTS = ("ffn_norm", "attn_input")    # pi2.predictor.input: the FFN's input, or the layer's attn_norm output
PRED_BLOCK = 32                             # values per block of low-bit rows (and the lowrank rank's multiple)


def row_bytes(qtype: int, n: int) -> int:
    """Bytes of one row of n values of ggml type qtype."""
    _, block, size = GGML_TYPES[qtype]
    return n // block * size


def lowbit_row_bytes(n_embd: int, bits: int) -> int:
    """Bytes of one low-bit predictor row: per block of PRED_BLOCK values an F16 scale and the packed codes."""
    return n_embd // PRED_BLOCK * (2 + PRED_BLOCK * bits // 8)


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
