# layout.py — the pi2 file's FFN layout: neuron order, the row type of the transposed `down`, and bundles.
# Owns: the hot-first permutation, choosing the down row type from the source's bits, re-quantizing
#       down columns to rows, and packing (gate,) up and down rows into fixed-size bundle records.
# Does not: profile activations (profile.py) or write files (writer.py).
from __future__ import annotations

import numpy as np

from pi2.errors import UnsupportedError
from pi2.model.gguf_file import GGML_TYPES, TYPE_IDS
from pi2.reference.quants import dequantize, quantize_weight

LAYOUTS = ("bundle-ud", "bundle-gud")
FFN_TYPES = ("auto", "i8", "q8_0", "q5_1", "q4_1", "f32", "f16")
BUNDLE_ALIGN = 32
I8 = TYPE_IDS["I8"]      # --ffn-type i8: int8 rows, float scales per row and column (blk.L.ffn_down_(col)scale)
# source type of ffn_down -> row type of the transposed rows (elementwise types transpose exactly). Quantized
# sources become I8 by default (`auto`): int8 with per-row and per-column float scales, 8.0 bits a weight,
# summed in integers (pi2/reference/down_i8.py); SmolLM2 at keep 1 costs +0.23 % perplexity over the source, Q8_0 rows
# (8.5 bits, summed in float, about 3x slower) +0.18 %, Q5_1 from a Q4_1 source (4 % error) +3.3 % (pydoc topics,
# -c 512, 8 chunks). `--ffn-type q5_1` trades that for 30 % fewer down bytes (flash streaming); `q4_1` goes one
# step further (4-bit sources -> Q4_1, 5- and 6-bit -> Q5_1) for the fewest bytes a streamed neuron costs.
_DOWN_ROW = {"F32": "F32", "F16": "F16", "BF16": "BF16"}
_DOWN_Q5 = {"Q4_0": "Q5_0", "IQ4_NL": "Q5_0", "IQ4_XS": "Q5_0", "Q4_1": "Q5_1", "Q4_K": "Q5_1", "Q3_K": "Q5_1",
            "Q2_K": "Q5_1", "Q5_0": "Q8_0", "Q5_1": "Q8_0", "Q5_K": "Q8_0", "Q6_K": "Q8_0", "Q8_0": "Q8_0"}
_DOWN_Q4 = {"Q4_0": "Q4_1", "IQ4_NL": "Q4_1", "IQ4_XS": "Q4_1", "Q4_1": "Q4_1", "Q4_K": "Q4_1", "Q3_K": "Q4_1",
            "Q2_K": "Q4_1", "Q5_0": "Q5_1", "Q5_1": "Q5_1", "Q5_K": "Q5_1", "Q6_K": "Q5_1", "Q8_0": "Q8_0"}


def permutation(freq: np.ndarray) -> np.ndarray:
    """New index -> source neuron, by descending frequency (ties keep source order)."""
    return np.argsort(-np.asarray(freq, np.float64), kind="stable").astype(np.int32)


def down_row_type(src_type: int, n_embd: int, ffn_type: str = "auto", transposed: bool = True) -> int:
    """ggml type of the down rows. A source already stored as rows (PWRI ffn_down_t) keeps its type."""
    if ffn_type == "f32":
        return TYPE_IDS["F32"]
    if ffn_type == "f16":
        return TYPE_IDS["F16"]
    name = GGML_TYPES[src_type][0]
    if not transposed:
        return src_type
    if name in _DOWN_ROW and ffn_type != "i8":
        row = _DOWN_ROW[name]
    elif ffn_type in ("auto", "i8") and (name in _DOWN_Q5 or ffn_type == "i8"):
        return I8
    elif name not in _DOWN_Q5:
        raise UnsupportedError(f"cannot choose a row type for ffn_down of type {name}; use --ffn-type f32 or f16")
    else:
        row = {"q5_1": _DOWN_Q5, "q4_1": _DOWN_Q4}.get(ffn_type, {}).get(name, "Q8_0")
    if GGML_TYPES[TYPE_IDS[row]][1] > 1 and n_embd % GGML_TYPES[TYPE_IDS[row]][1]:
        return TYPE_IDS["F16"]
    return TYPE_IDS[row]


def encode_i8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """float32 rows (rows, n) -> (int8 q (rows, n) in [-127, 127], float32 scale per row r, per column c) with
    value = c_j·r_i·q_ij: c = sqrt(rms·max|.|) of each column (1 for zero columns), then per row of x/c
    r = amax/127 and q = round-half-even(·127/amax) (all-zero rows: r 0, q 0)."""
    x = np.ascontiguousarray(x, np.float32)
    a = np.abs(x)
    c = np.sqrt(np.sqrt((x.astype(np.float64) ** 2).mean(axis=0)) * a.max(axis=0)).astype(np.float32)
    c[~(c > 0)] = 1
    xc = x / c
    amax = np.abs(xc).max(axis=1)
    inv = np.divide(np.float32(127), amax, out=np.zeros_like(amax), where=amax > 0)
    q = np.clip(np.rint(xc * inv[:, None]), -127, 127).astype(np.int8)
    return q, (amax / np.float32(127)).astype(np.float32), c


def row_bytes(qtype: int, n: int) -> int:
    _, block, size = GGML_TYPES[qtype]
    return n // block * size


def encode_rows(x: np.ndarray, qtype: int) -> np.ndarray:
    """float32 (rows, n) -> uint8 (rows, row_bytes) of qtype."""
    x = np.ascontiguousarray(x, np.float32)
    if GGML_TYPES[qtype][0] == "F32":
        return x.view(np.uint8).reshape(x.shape[0], -1)
    if GGML_TYPES[qtype][0] == "F16":
        return x.astype(np.float16).view(np.uint8).reshape(x.shape[0], -1)
    return quantize_weight(x, qtype)


def down_rows(src_raw: np.ndarray, src_type: int, n_embd: int, n_ff: int, perm: np.ndarray,
              row_type: int, transposed: bool = True) -> tuple[np.ndarray, tuple | None, float]:
    """Down as rows in the new neuron order: (bytes (n_ff, row_bytes), the (row, column) float32 scales of I8
    rows (None for other types), relative L2 error of the stored values against the source's)."""
    if not transposed:                                  # already rows (PWRI ffn_down_t)
        src = dequantize(src_raw, src_type, n_embd)[perm]
        if row_type == src_type:
            return np.ascontiguousarray(src_raw[perm]), None, 0.0
    else:
        src = np.ascontiguousarray(dequantize(src_raw, src_type, n_ff).T[perm])   # (n_ff, n_embd)
    scale = None
    if row_type == I8:
        q, r, c = encode_i8(src)
        scale = (r, c)
        raw, got = q.view(np.uint8), q.astype(np.float32) * r[:, None] * c[None, :]
    else:
        raw = encode_rows(src, row_type)
        got = dequantize(raw, row_type, n_embd)
    err = float(np.linalg.norm(got - src) / (np.linalg.norm(src) or 1.0))
    return raw, scale, err


def bundle(parts: list, n_ff: int) -> np.ndarray:
    """Concatenate per-neuron byte rows (each (n_ff, k)) and zero-pad to a multiple of BUNDLE_ALIGN."""
    width = sum(p.shape[1] for p in parts)
    padded = -(-width // BUNDLE_ALIGN) * BUNDLE_ALIGN
    out = np.zeros((n_ff, padded), np.uint8)
    at = 0
    for p in parts:
        out[:, at:at + p.shape[1]] = p
        at += p.shape[1]
    return out.view(np.int8)


def unbundle(b: np.ndarray, widths: list) -> list:
    """Split bundle records (n_ff, bundle_bytes) back into their byte parts."""
    b = np.asarray(b).view(np.uint8)
    out, at = [], 0
    for w in widths:
        out.append(b[:, at:at + w])
        at += w
    return out
