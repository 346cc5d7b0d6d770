"""pi2file.py — a small, independent writer of pi2 files (the format in the pi2 file spec) for the tests.

Owns: `write_pi2(src, dst, ...)`: profile a plain GGUF fixture with the numpy reference on a few tokens,
permute neurons by descending activation frequency, bundle (gate,) up and transposed down rows, and write
the statistics (freq, thresholds and error curves on the keep grid) with GGUFWriter at alignment 4096.
The converter's own tests cross-check against this file's output.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import quantize

from pi2.model.loader import load_model
from pi2.reference.quants import dequantize
from pi2.reference.forward import ReferenceContext
from pi2.reference.sparse_ffn import act_values

GRID = (0.1, 0.25, 0.5, 0.75, 1.0)


def writer_like(r: GGUFReader, dst) -> GGUFWriter:
    """A GGUFWriter to dst (alignment 4096) holding every key of the file r reads, tensors still to add."""
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    w = GGUFWriter(str(dst), arch)
    w.add_custom_alignment(4096)
    for f in r.fields.values():
        if f.name.startswith("GGUF.") or f.name in ("general.architecture", "general.alignment"):
            continue
        vt = f.types[0]
        w.add_key_value(f.name, f.contents(), vt, f.types[-1] if vt == GGUFValueType.ARRAY else None)
    return w


def _row_bytes(data: np.ndarray, n_rows: int) -> np.ndarray:
    return np.ascontiguousarray(data).view(np.uint8).reshape(n_rows, -1)


def _quant_rows(x: np.ndarray, qtype: QT) -> np.ndarray:
    x = np.ascontiguousarray(x, np.float32)
    if qtype == QT.F32:
        return _row_bytes(x, x.shape[0])
    if qtype == QT.F16:
        return _row_bytes(x.astype(np.float16), x.shape[0])
    return quantize(x, qtype)


def profile(src, tokens) -> list:
    """Per layer, the (gate, up) outputs of every calibration token (the dense reference's own values)."""
    model = load_model(src)
    ctx = ReferenceContext(model, max(len(tokens), 8), dense=True)
    seen: dict = {}
    ctx.trace = lambda name, il, t: seen.__setitem__((name, il), t) if name in ("ffn_gate", "ffn_up") else None
    ctx.decode(tokens)
    out = [(seen[("ffn_gate", il)], seen[("ffn_up", il)]) for il in range(model.config.n_layer)]
    act = model.config.ffn_act
    model.close()
    return out, act


def write_pi2(src, dst, *, down_type: str = "F32", layout: str = "bundle-ud", tokens=None, grid=GRID,
              default_keep: float = 1.0, score: str = "act") -> Path:
    """Convert the plain GGUF `src` into the pi2 file `dst` (down rows of type `down_type`)."""
    dtype = QT[down_type]
    tokens = list(tokens) if tokens is not None else [(7 * i + 3) % 500 for i in range(48)]
    calib, act = profile(src, tokens)
    r = GGUFReader(str(src))
    w = writer_like(r, dst)
    tensors = {t.name: t for t in r.tensors}
    n_layer = sum(1 for n in tensors if n.endswith(".ffn_gate.weight"))
    w.add_uint32("pi2.version", 1)
    w.add_string("pi2.source.file", Path(src).name)
    w.add_string("pi2.source.magic", "GGUF")
    w.add_string("pi2.ffn.layout", layout)
    w.add_string("pi2.ffn.score", score)
    w.add_array("pi2.ffn.keep_grid", [float(g) for g in grid])
    w.add_float32("pi2.ffn.default_keep", default_keep)
    w.add_array("pi2.ffn.down_types", [int(dtype)] * n_layer)
    w.add_array("pi2.ffn.up_types", [int(tensors[f"blk.{il}.ffn_up.weight"].tensor_type) for il in range(n_layer)])
    if layout == "bundle-gud":
        w.add_array("pi2.ffn.gate_types",
                    [int(tensors[f"blk.{il}.ffn_gate.weight"].tensor_type) for il in range(n_layer)])
    for t in r.tensors:
        if ".ffn_gate." in t.name or ".ffn_up." in t.name or ".ffn_down." in t.name:
            continue
        w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    for il in range(n_layer):
        b = f"blk.{il}."
        g_t, u_t, d_t = (tensors[b + n + ".weight"] for n in ("ffn_gate", "ffn_up", "ffn_down"))
        n_ff, n_embd = int(g_t.shape[1]), int(g_t.shape[0])
        gate, up = calib[il]
        a = np.abs(act_values(gate, act) if score == "act" else act_values(gate, act) * up)
        t50 = np.quantile(a, 0.5)
        freq = (a > t50).mean(axis=0).astype(np.float32)
        perm = np.argsort(-freq, kind="stable").astype(np.int32)
        down = dequantize(_row_bytes(d_t.data, n_embd), int(d_t.tensor_type), n_ff)     # (n_embd, n_ff)
        h = act_values(gate, act) * up if act != "drelu" else np.maximum(gate, 0) * np.maximum(up, 0)
        y = h @ down.T
        thresh, err = [], []
        for k in grid:
            t = float(np.quantile(a, 1.0 - k)) if k < 1.0 else 0.0
            thresh.append(t)
            m = a > t if k < 1.0 else np.ones_like(a, bool)
            err.append(float(np.linalg.norm(np.where(m, h, 0) @ down.T - y) / max(np.linalg.norm(y), 1e-30)))
        parts = []
        if layout == "bundle-gud":
            parts.append(_row_bytes(g_t.data, n_ff)[perm])
        if dtype == QT.I8:     # int8 rows: column scales (here the column max), then amax/127 per row
            rows = np.ascontiguousarray(down.T[perm], np.float32)
            col = np.abs(rows).max(axis=0)
            col = np.where(col > 0, col, 1).astype(np.float32)
            rows = rows / col
            amax = np.abs(rows).max(axis=1)
            scale = (amax / np.float32(127)).astype(np.float32)
            q = np.clip(np.rint(rows / np.where(scale > 0, scale, 1)[:, None]), -127, 127).astype(np.int8)
            w.add_tensor(b + "ffn_down_scale.weight", scale)
            w.add_tensor(b + "ffn_down_colscale.weight", col)
            parts += [_row_bytes(u_t.data, n_ff)[perm], q.view(np.uint8)]
        else:
            parts += [_row_bytes(u_t.data, n_ff)[perm], _quant_rows(down.T[perm], dtype)]
        rec = np.concatenate(parts, axis=1)
        pad = -rec.shape[1] % 32
        rec = np.pad(rec, ((0, 0), (0, pad)))
        if layout != "bundle-gud":
            w.add_tensor(b + "ffn_gate.weight", _row_bytes(g_t.data, n_ff)[perm], raw_dtype=g_t.tensor_type)
        w.add_tensor(b + "ffn_bundle.weight", rec.view(np.int8))
        w.add_tensor(b + "ffn_perm.weight", perm)
        w.add_tensor(b + "ffn_freq.weight", freq[perm])
        w.add_tensor(b + "ffn_thresh.weight", np.array(thresh, np.float32))
        w.add_tensor(b + "ffn_err.weight", np.array(err, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(dst)
